//! Regressions from a cold review of the shared-bucket write path: sequences that once broke I8
//! (a stale inode, an empty object taken for ours, an inode's view after a rename), I10 (a
//! release after a failed close, a failed first write) and "readers see writers". Each asserts
//! what the invariant requires.

use std::sync::Arc;
use std::time::Duration;

use super::tests::{W, WT};
use super::*;
use crate::namespace::ROOT_INO;
use crate::store::memory::MemoryStore;
use crate::write::upload::UploadConfig;

const LATER: Duration = Duration::from_secs(3600);

fn machine_cfg(
    store: &Arc<MemoryStore>,
    dir: &std::path::Path,
    name: &str,
    delay: Duration,
    stat_ttl: Duration,
) -> Filesystem<MemoryStore> {
    let mut w = WriteConfig::new(dir.join(name));
    w.write_back_delay = delay;
    w.retry_initial = Duration::from_millis(5);
    w.retry_max = Duration::from_millis(20);
    w.upload = UploadConfig {
        single_shot_threshold: 64 * 1024,
        part_size: 16 * 1024,
        ..UploadConfig::default()
    };
    let mut cfg = MountConfig::new("bkt");
    cfg.stat_ttl = stat_ttl;
    Filesystem::with_write(store.clone(), cfg, w).unwrap()
}

async fn save(fs: &Filesystem<MemoryStore>, name: &str, data: &[u8]) -> Ino {
    let (attr, h) = fs.create(ROOT_INO, name).await.unwrap();
    fs.write(h.fh, 0, data).await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    attr.ino
}

/// R1 (I8). After `mv a b` the renamed inode's basis is None; the next look at `b` takes
/// whatever is there for what the user saw. Another writer replaces `b` after the rename; the
/// user's `rm b` deletes their object, which this mount never saw.
#[tokio::test]
async fn r1_rm_after_rename_deletes_an_unseen_replacement() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("a", &b"mine"[..]);
    let fs = machine_cfg(&store, dir.path(), "m1", Duration::ZERO, Duration::ZERO);
    let a = fs.lookup(ROOT_INO, "a").await.unwrap();
    fs.rename(ROOT_INO, "a", ROOT_INO, "b").await.unwrap();
    store.insert("b", &b"theirs, unseen"[..]);
    // The kernel revalidates its (renamed) inode once its attributes time out.
    let _ = fs.getattr(a.ino).await;
    fs.unlink(ROOT_INO, "b").await.unwrap();
    assert_eq!(
        store.object_bytes("b").as_deref(),
        Some(&b"theirs, unseen"[..]),
        "I8: rm deleted a generation this mount never saw"
    );
}

/// R1b (I8): the same hole through `mv c b` (a rename over the renamed name).
#[tokio::test]
async fn r1b_mv_over_a_renamed_name_replaces_an_unseen_replacement() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("a", &b"mine"[..]);
    store.insert("c", &b"new draft"[..]);
    let fs = machine_cfg(&store, dir.path(), "m1", Duration::ZERO, Duration::ZERO);
    fs.lookup(ROOT_INO, "a").await.unwrap();
    fs.lookup(ROOT_INO, "c").await.unwrap();
    fs.rename(ROOT_INO, "a", ROOT_INO, "b").await.unwrap();
    store.insert("b", &b"theirs, unseen"[..]);
    fs.rename(ROOT_INO, "c", ROOT_INO, "b").await.unwrap();
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(
        store.object_bytes("b").as_deref(),
        Some(&b"theirs, unseen"[..]),
        "I8: mv replaced a generation this mount never saw (it should go beside as a conflict copy)"
    );
}

/// R2 (an open file reads its generation / readers see writers). A descriptor open on `a`,
/// then `mv a b`, then another writer replaces `b`: the old descriptor moves to *their*
/// generation and reads bytes that neither it nor this mount ever wrote.
#[tokio::test]
async fn r2_a_reader_moves_to_another_writers_generation_after_rename() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("a", &b"mine"[..]);
    let fs = machine_cfg(&store, dir.path(), "m1", Duration::ZERO, Duration::ZERO);
    let a = fs.lookup(ROOT_INO, "a").await.unwrap();
    let r = fs.open(a.ino, OpenMode::default()).await.unwrap();
    assert_eq!(&fs.read(r.fh, 0, 100).await.unwrap()[..], b"mine");
    fs.rename(ROOT_INO, "a", ROOT_INO, "b").await.unwrap();
    store.insert("b", &b"THEIRS"[..]);
    let _ = fs.getattr(a.ino).await;
    let got = fs.read(r.fh, 0, 100).await;
    assert_ne!(
        got.as_deref().ok(),
        Some(&b"THEIRS"[..]),
        "the open descriptor now reads another writer's generation"
    );
    fs.release(r.fh).await;
}

/// R3 (I8, and I2 for an append). Opening for writing an inode whose view rests on G1 while
/// the bucket (past the stat TTL) has someone else's G2: the read path answers ESTALE, the
/// write path takes G2 as its base, so the truncating open replaces G2 unseen.
#[tokio::test]
async fn r3_a_truncating_open_of_a_stale_inode_replaces_an_unseen_generation() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("f", &b"seen v1"[..]);
    let fs = machine_cfg(&store, dir.path(), "m1", Duration::ZERO, Duration::ZERO);
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    store.insert("f", &b"theirs v2, never seen here"[..]);
    // Opening this inode for reading would be refused (ESTALE, open_file's basis check);
    // opening it for writing is not.
    let h = match fs.open(f.ino, WT).await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("R3: write open refused: {e:?}");
            return;
        }
    };
    fs.write(h.fh, 0, b"ours").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    eprintln!("R3 keys: {:?}", store.keys());
    assert_eq!(
        store.object_bytes("f").as_deref(),
        Some(&b"theirs v2, never seen here"[..]),
        "I8: a truncating open replaced a generation its inode never saw"
    );
}

/// R3b: the same with an append (`>>`): the kernel appends at the size *it* knows (G1's), into
/// G2's bytes: the upload holds bytes that no version had (I2) and replaces G2 (I8).
#[tokio::test]
async fn r3b_an_append_to_a_stale_inode_mixes_generations() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("log", &b"line 1\n"[..]);
    let fs = machine_cfg(&store, dir.path(), "m1", Duration::ZERO, Duration::ZERO);
    let f = fs.lookup(ROOT_INO, "log").await.unwrap();
    store.insert("log", &b"THEIR LINE 1\nTHEIR LINE 2\n"[..]);
    let h = match fs.open(f.ino, W).await {
        Ok(h) => h,
        Err(_) => return,
    };
    // The kernel's i_size for this inode is 7 (G1's): it appends there.
    fs.write(h.fh, 7, b"line 2\n").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(
        store.object_bytes("log").as_deref(),
        Some(&b"THEIR LINE 1\nTHEIR LINE 2\n"[..]),
        "I8/I2: the append landed over (and inside) another writer's generation"
    );
}

/// R4 (I8, I12's empty-object ambiguity). Machine 1 saved an empty file (its upload waits);
/// machine 2's empty file lands at the name. Machine 1's `rm` takes machine 2's empty object
/// for its own (same CRC32C and size as its pending version) and deletes it.
#[tokio::test]
async fn r4_rm_of_a_staged_empty_file_deletes_another_machines_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let m1 = machine_cfg(&store, dir.path(), "m1", LATER, Duration::from_secs(60));
    let m2 = machine_cfg(
        &store,
        dir.path(),
        "m2",
        Duration::ZERO,
        Duration::from_secs(60),
    );
    save(&m1, "lock", b"").await;
    save(&m2, "lock", b"").await;
    assert_eq!(m2.drain(false).await, 0);
    assert!(store.object_bytes("lock").is_some());
    m1.unlink(ROOT_INO, "lock").await.unwrap();
    assert!(
        store.object_bytes("lock").is_some(),
        "I8: machine 2's empty file was deleted by machine 1's rm of its own unsent one"
    );
}

/// R5 (I10). The close fails (the missing bytes could not be fetched: the bucket blinked), the
/// bucket is back before the kernel's RELEASE, and the release commits and uploads the edit
/// the user was told had failed.
#[tokio::test]
async fn r5_release_after_a_failed_close_uploads_the_failed_edit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let old = vec![1u8; 100_000];
    store.insert("f", old.clone());
    let fs = machine_cfg(
        &store,
        dir.path(),
        "m1",
        Duration::ZERO,
        Duration::from_secs(60),
    );
    let attr = fs.lookup(ROOT_INO, "f").await.unwrap();
    let h = fs.open(attr.ino, W).await.unwrap();
    fs.write(h.fh, 10, b"edit").await.unwrap();
    store.set_offline(true);
    assert!(fs.flush(h.fh).await.is_err(), "the close fails");
    store.set_offline(false);
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert!(
        store.object_bytes("f").unwrap() == old,
        "I10: nothing of a handle whose last commit failed may be uploaded"
    );
}

/// Control for R1: the same sequence without the rename is protected (the inode's basis is
/// the generation looked up, and a GETATTR that finds another writer's one does not move it).
#[tokio::test]
async fn r1_control_without_rename_rm_leaves_the_replacement() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("b", &b"mine"[..]);
    let fs = machine_cfg(&store, dir.path(), "m1", Duration::ZERO, Duration::ZERO);
    let b = fs.lookup(ROOT_INO, "b").await.unwrap();
    store.insert("b", &b"theirs, unseen"[..]);
    let _ = fs.getattr(b.ino).await;
    fs.unlink(ROOT_INO, "b").await.unwrap();
    assert_eq!(
        store.object_bytes("b").as_deref(),
        Some(&b"theirs, unseen"[..])
    );
}

/// R6 (I10 reporting). The first write to a clean item fails (ENOSPC): the item is held but
/// not dirty, so close() succeeds, release retires the item, and nothing reports the failure.
#[tokio::test]
async fn r6_a_failed_first_write_is_not_reported_and_close_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("f", vec![1u8; 50_000]);
    let mut w = WriteConfig::new(dir.path().join("m1"));
    w.write_back_delay = Duration::ZERO;
    w.cache_size = Some(100_000);
    let fs = Filesystem::with_write(store.clone(), MountConfig::new("bkt"), w).unwrap();
    let attr = fs.lookup(ROOT_INO, "f").await.unwrap();
    let h = fs.open(attr.ino, W).await.unwrap();
    assert_eq!(
        fs.write(h.fh, 0, &vec![7u8; 200_000]).await,
        Err(FsError::NoSpace)
    );
    let closed = fs.flush(h.fh).await;
    fs.release(h.fh).await;
    let s = fs.write_status().await;
    assert!(
        closed.is_err() || s.held_files == 1,
        "a failed write is neither an error at close nor reported as not saved: close={closed:?} status={s:?}"
    );
}
