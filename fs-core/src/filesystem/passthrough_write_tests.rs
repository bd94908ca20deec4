//! Files the kernel writes itself (`write/passthrough.rs`): the tests stand in for the kernel
//! by writing the backing file an open hands out, and tell the engine only what the kernel
//! would (flush, fsync, getattr, release). Bytes are checked in the bucket.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::namespace::ROOT_INO;
use crate::store::memory::MemoryStore;

use super::passthrough::Counted;
use super::tests::{W, WT};

const R: OpenMode = OpenMode {
    write: false,
    truncate: false,
    process: None,
};

fn wcfg(cache: &std::path::Path, delay: Duration) -> WriteConfig {
    let mut w = WriteConfig::new(cache.to_path_buf());
    w.write_back_delay = delay;
    w
}

fn mount(store: &Arc<MemoryStore>, w: WriteConfig) -> Filesystem<MemoryStore> {
    let fs = Filesystem::with_write(store.clone(), MountConfig::new("bkt"), w).unwrap();
    assert!(
        fs.enable_passthrough(Through {
            reads: true,
            writes: true
        })
        .writes,
        "files being written pass through"
    );
    fs
}

/// A runtime on one thread with time paused (it moves only when every task waits), for a
/// test that drops it mid-way, as a crash of the daemon would.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// The backing file of a passthrough open.
fn backing(o: &Opened) -> Arc<std::fs::File> {
    match &o.io {
        KernelIo::Passthrough(f) => f.clone(),
        KernelIo::Daemon => panic!("not passed through"),
    }
}

/// A mount with write-back delay `delay`, its cache in `dir`, over a bucket whose `f` holds
/// "the good object"; and the inode of `f`.
async fn over_good_object(
    dir: &tempfile::TempDir,
    delay: Duration,
) -> (Arc<MemoryStore>, Filesystem<MemoryStore>, Ino) {
    let store = Arc::new(MemoryStore::new());
    store.insert("f", b"the good object".to_vec());
    let fs = mount(&store, wcfg(&dir.path().join("c"), delay));
    let ino = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
    (store, fs, ino)
}

#[tokio::test(start_paused = true)]
async fn the_kernels_writes_are_taken_at_close_and_sealed_once_due() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, wcfg(&dir.path().join("c"), Duration::ZERO));
    let (attr, w) = fs.create(ROOT_INO, "f").await.unwrap();
    let file = backing(&w);
    file.write_all_at(b"hello, ", 0).unwrap();
    assert_eq!(
        fs.getattr(attr.ino).await.unwrap().size,
        7,
        "getattr: the file's size"
    );
    // A reader joins, on the same file; a writer too.
    let r = fs.open(attr.ino, R).await.unwrap();
    assert!(Arc::ptr_eq(&backing(&r), &file));
    let w2 = fs.open(attr.ino, W).await.unwrap();
    assert!(Arc::ptr_eq(&backing(&w2), &file));
    file.write_all_at(b"world", 7).unwrap();
    // A close while handles stay open: journaled without its CRC32C, which the engine
    // computes once the upload is due, as an fsync would: uploaded with the handles open.
    fs.flush(w.fh).await.unwrap();
    fs.release(w.fh).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        &store.object_bytes("f").unwrap()[..],
        b"hello, world",
        "uploaded once due, before the last release"
    );
    // A truncate through the daemon cuts the same file.
    fs.setattr(attr.ino, Some(11), None, Some(w2.fh))
        .await
        .unwrap();
    assert_eq!(fs.getattr(attr.ino).await.unwrap().size, 11);
    fs.flush(w2.fh).await.unwrap();
    fs.release(w2.fh).await;
    fs.release(r.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"hello, worl");
}

/// A crash while the kernel still writes the file (a close made, handles open): the next
/// mount takes the staged file as it is, every byte written before the crash.
#[test]
fn a_crash_with_the_file_open_replays_it_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("c");
    let store = Arc::new(MemoryStore::new());
    let rt = paused_runtime();
    let (a, b) = (vec![1u8; 70_000], vec![2u8; 30_000]);
    rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::from_secs(3600)));
        let (_, w) = fs.create(ROOT_INO, "f").await.unwrap();
        let file = backing(&w);
        file.write_all_at(&a, 0).unwrap();
        fs.flush(w.fh).await.unwrap();
        file.write_all_at(&b, a.len() as u64).unwrap();
        // The crash: no release, no drain.
        drop(fs);
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::ZERO));
        assert_eq!(fs.start().await.unwrap(), 1);
        assert_eq!(fs.drain(false).await, 0);
    });
    let want: Vec<u8> = a.iter().chain(&b).copied().collect();
    assert_eq!(store.object_bytes("f").unwrap(), want);
}

/// A mapping that outlives a crash of the daemon (the process that made it goes on): after the
/// next mount replays and uploads the file, a store through it is uploaded too, and the item
/// retires once it is unmapped.
#[test]
fn a_mapping_that_outlives_a_crash_is_followed_after_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("c");
    let store = Arc::new(MemoryStore::new());
    let rt = paused_runtime();
    let bytes = rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::from_secs(3600)));
        let (_, w) = fs.create(ROOT_INO, "f").await.unwrap();
        let file = backing(&w);
        file.set_len(8192).unwrap();
        let bytes = map_shared(&file, 8192);
        bytes[..4].copy_from_slice(b"one ");
        fs.flush(w.fh).await.unwrap();
        // The crash: no release, no drain; the mapping stays.
        drop(fs);
        bytes
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    let rt = paused_runtime();
    rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::ZERO));
        assert_eq!(fs.start().await.unwrap(), 1);
        followed_until_unmapped(&fs, &store, bytes).await;
    });
}

/// A kill while a mapping is followed after the file's upload: the file's record stayed with
/// the upload, so the next mount finds the staged copy and uploads what was stored since.
#[test]
fn a_kill_while_a_mapping_is_followed_after_the_upload_keeps_its_stores() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("c");
    let store = Arc::new(MemoryStore::new());
    let rt = paused_runtime();
    let bytes = rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::ZERO));
        let (_, bytes) = mapped_and_closed(&fs).await;
        // The upload, and the watch's first look.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(&store.object_bytes("f").unwrap()[..8], b"one \0\0\0\0");
        bytes[4..8].copy_from_slice(b"two ");
        // The kill, before the watch looks again.
        drop(fs);
        bytes
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    let rt = paused_runtime();
    rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::ZERO));
        assert_eq!(fs.start().await.unwrap(), 1, "the file is replayed");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(&store.object_bytes("f").unwrap()[..8], b"one two ");
        unmap(bytes);
        let _ = tokio::time::timeout(Duration::from_secs(60), fs.drain(false)).await;
    });
}

/// A store through a shared mapping after the last release (the kernel maps the backing file
/// itself): the upload finds the bytes changed since the seal, and uploads them as they are
/// now, never the seal's CRC32C over other bytes.
#[tokio::test(start_paused = true)]
async fn a_store_after_the_release_is_uploaded_as_it_is_now() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(
        &store,
        wcfg(&dir.path().join("c"), Duration::from_secs(3600)),
    );
    let (_, w) = fs.create(ROOT_INO, "f").await.unwrap();
    let file = backing(&w);
    file.write_all_at(&[3u8; 50_000], 0).unwrap();
    fs.flush(w.fh).await.unwrap();
    fs.release(w.fh).await;
    // The mapping's store, after the release sealed the file.
    file.write_all_at(&[4u8; 100], 1000).unwrap();
    assert_eq!(fs.drain(false).await, 0);
    let mut want = vec![3u8; 50_000];
    want[1000..1100].copy_from_slice(&[4u8; 100]);
    assert_eq!(store.object_bytes("f").unwrap(), want);
}

/// What a crash after an upload of a file the kernel still writes leaves, by what came
/// between the upload and the crash.
#[derive(Debug, Clone, Copy)]
enum AfterUpload {
    /// More written, nothing said.
    Written,
    /// A second fsync, then more written.
    SyncedAgain,
    /// Renamed over an existing file `g`, nothing written since.
    RenamedOver,
    /// Renamed over `g`, then more written.
    RenamedOverAndWritten,
    /// More written while the cache disk was nearly full: held (I10), never uploaded.
    Held,
}

/// A crash after an `fsync()` uploaded a file whose descriptors stay open: the file's record
/// stays with the upload, so the next mount finds the staged copy and uploads it as it is,
/// with what the kernel wrote after the upload; under the name it has then; and a file held
/// since keeps the bucket at its last whole version.
#[test]
fn a_crash_after_an_upload_while_the_kernel_writes_keeps_what_it_wrote_since() {
    for case in [
        AfterUpload::Written,
        AfterUpload::SyncedAgain,
        AfterUpload::RenamedOver,
        AfterUpload::RenamedOverAndWritten,
        AfterUpload::Held,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("c");
        let store = Arc::new(MemoryStore::new());
        store.insert("g", b"another file".to_vec());
        let rt = paused_runtime();
        let (a, b) = (vec![1u8; 70_000], vec![2u8; 30_000]);
        rt.block_on(async {
            let fs = mount(&store, wcfg(&cache, Duration::from_secs(3600)));
            let wb = fs.write.as_ref().unwrap().clone();
            fs.lookup(ROOT_INO, "g").await.unwrap();
            let (_, w) = fs.create(ROOT_INO, "f").await.unwrap();
            let file = backing(&w);
            file.write_all_at(&a, 0).unwrap();
            fs.fsync(w.fh).await.unwrap();
            assert_eq!(
                store.object_bytes("f").unwrap(),
                a,
                "{case:?}: fsync uploads"
            );
            match case {
                AfterUpload::Written => file.write_all_at(&b, a.len() as u64).unwrap(),
                AfterUpload::SyncedAgain => {
                    fs.fsync(w.fh).await.unwrap();
                    file.write_all_at(&b, a.len() as u64).unwrap();
                }
                AfterUpload::RenamedOver => {
                    fs.rename(ROOT_INO, "f", ROOT_INO, "g").await.unwrap();
                    // Back in the bucket under its new name at once, not at its last close.
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    let got = store.object_bytes("g");
                    assert!(
                        got.as_deref() == Some(&a[..]),
                        "{case:?}: g is not the file"
                    );
                    assert!(store.object_bytes("f").is_none(), "{case:?}: f stays");
                }
                AfterUpload::RenamedOverAndWritten => {
                    fs.rename(ROOT_INO, "f", ROOT_INO, "g").await.unwrap();
                    file.write_all_at(&b, a.len() as u64).unwrap();
                }
                AfterUpload::Held => {
                    wb.pretend_free_bytes(Some(1 << 20));
                    file.write_all_at(&b, a.len() as u64).unwrap();
                    // The close finds the disk nearly full: a write may have failed.
                    assert!(matches!(fs.flush(w.fh).await, Err(FsError::NoSpace)));
                    assert_eq!(wb.status().await.held_files, 1, "{case:?}");
                }
            }
            // The crash: no close, no release, no drain.
            drop(fs);
        });
        rt.shutdown_timeout(Duration::from_secs(5));
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let fs = mount(&store, wcfg(&cache, Duration::ZERO));
            fs.start().await.unwrap();
            assert_eq!(fs.drain(false).await, 0, "{case:?}");
        });
        rt.shutdown_timeout(Duration::from_secs(5));
        let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
        let (name, want) = match case {
            AfterUpload::Written | AfterUpload::SyncedAgain => ("f", &whole),
            AfterUpload::RenamedOver => ("g", &a),
            AfterUpload::RenamedOverAndWritten => ("g", &whole),
            AfterUpload::Held => ("f", &a),
        };
        let got = store.object_bytes(name);
        assert!(
            got.as_deref() == Some(&want[..]),
            "{case:?}: {name} holds {:?} bytes, not the {} written",
            got.map(|g| g.len()),
            want.len()
        );
        if matches!(
            case,
            AfterUpload::RenamedOver | AfterUpload::RenamedOverAndWritten
        ) {
            assert!(store.object_bytes("f").is_none(), "{case:?}: f came back");
        }
        // Nothing was set aside, and nothing is left to replay but changes not saved.
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let fs = mount(&store, wcfg(&cache, Duration::ZERO));
            let not_saved = matches!(case, AfterUpload::Held) as usize;
            assert_eq!(fs.start().await.unwrap(), not_saved, "{case:?}: replayed");
        });
        let aside: Vec<_> = walkdir(&cache)
            .into_iter()
            .filter(|p| p.to_string_lossy().contains("damaged"))
            .collect();
        assert!(aside.is_empty(), "{case:?}: set aside {aside:?}");
    }
}

/// A version that lands after its file was held (a write may have failed since, I10) keeps
/// no record for the kernel's writes: a crash then leaves the bucket with that version, never
/// the held file as it is.
#[test]
fn a_version_landing_after_a_hold_keeps_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("c");
    let store = Arc::new(MemoryStore::new());
    let rt = paused_runtime();
    let (a, b) = (vec![1u8; 70_000], vec![2u8; 30_000]);
    rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::from_secs(3600)));
        let wb = fs.write.as_ref().unwrap().clone();
        let (_, w) = fs.create(ROOT_INO, "f").await.unwrap();
        let file = backing(&w);
        file.write_all_at(&a, 0).unwrap();
        store.set_offline(true);
        assert!(fs.fsync(w.fh).await.is_err(), "its upload fails");
        wb.pretend_free_bytes(Some(1 << 20));
        file.write_all_at(&b, a.len() as u64).unwrap();
        assert!(matches!(fs.fsync(w.fh).await, Err(FsError::NoSpace)));
        wb.pretend_free_bytes(None);
        store.set_offline(false);
        // The first version's retry lands meanwhile.
        tokio::time::sleep(Duration::from_secs(120)).await;
        let got = store.object_bytes("f").unwrap();
        assert!(
            got == a,
            "not the version fsync'd first: {} bytes",
            got.len()
        );
        // The crash: no close, no release, no drain.
        drop(fs);
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::ZERO));
        fs.start().await.unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(60), fs.drain(true)).await;
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    let got = store.object_bytes("f").unwrap();
    assert!(got == a, "the held file was uploaded: {} bytes", got.len());
}

/// A close beside a descriptor left open, then the cache disk nears full while the other
/// descriptor writes: the seal the engine makes once the upload is due finds the file held
/// (a write may have failed, I10), keeps it as not saved, and nothing of it reaches the
/// bucket, not after a crash either.
#[test]
fn a_file_held_before_its_seal_when_due_is_never_uploaded() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("c");
    let store = Arc::new(MemoryStore::new());
    let rt = paused_runtime();
    rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::from_secs(1)));
        let wb = fs.write.as_ref().unwrap().clone();
        let (attr, w) = fs.create(ROOT_INO, "f").await.unwrap();
        let file = backing(&w);
        let w2 = fs.open(attr.ino, W).await.unwrap();
        file.write_all_at(&[1u8; 50_000], 0).unwrap();
        fs.flush(w.fh).await.unwrap();
        fs.release(w.fh).await;
        wb.pretend_free_bytes(Some(1 << 20));
        file.write_all_at(&[2u8; 4096], 50_000).unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(
            store.object_bytes("f").is_none(),
            "a held file was uploaded"
        );
        assert_eq!(wb.status().await.held_files, 1);
        // The crash, with the other descriptor still open.
        drop((w2, fs));
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    let rt = paused_runtime();
    rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::ZERO));
        fs.start().await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    assert!(
        store.object_bytes("f").is_none(),
        "uploaded after the crash"
    );
}

/// The record a file keeps after an upload while the kernel writes it goes with the file:
/// once it is released and retired, nothing is left to replay.
#[test]
fn the_record_kept_after_an_upload_goes_when_the_file_retires() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("c");
    let store = Arc::new(MemoryStore::new());
    let rt = paused_runtime();
    rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::from_secs(3600)));
        let (_, w) = fs.create(ROOT_INO, "f").await.unwrap();
        let (file, fh) = (backing(&w), w.fh);
        file.write_all_at(b"synced", 0).unwrap();
        fs.fsync(w.fh).await.unwrap();
        fs.flush(w.fh).await.unwrap();
        // The kernel lets go of the file with its last handle (no mapping of it is left).
        drop((w, file));
        fs.release(fh).await;
        assert_eq!(fs.drain(false).await, 0);
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::ZERO));
        assert_eq!(fs.start().await.unwrap(), 0, "a record outlived its file");
    });
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"synced");
}

/// fsync while the kernel writes the file returns with it in the bucket; a write after it is
/// uploaded after the last release.
#[tokio::test(start_paused = true)]
async fn fsync_of_an_open_passthrough_file_uploads_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(
        &store,
        wcfg(&dir.path().join("c"), Duration::from_secs(3600)),
    );
    let (_, w) = fs.create(ROOT_INO, "f").await.unwrap();
    let file = backing(&w);
    file.write_all_at(b"synced", 0).unwrap();
    fs.fsync(w.fh).await.unwrap();
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"synced");
    file.write_all_at(b" and more", 6).unwrap();
    fs.flush(w.fh).await.unwrap();
    fs.release(w.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"synced and more");
}

/// Only a file whose bytes are all local, with no version pending, passes through: an open of
/// an object not fetched, or of a file whose last close is still to be uploaded, goes through
/// the daemon, and so does every open beside it.
#[tokio::test(start_paused = true)]
async fn files_not_wholly_local_or_with_a_version_pending_go_through_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("old", vec![5u8; 10_000]);
    let fs = mount(
        &store,
        wcfg(&dir.path().join("c"), Duration::from_secs(3600)),
    );
    let old = fs.lookup(ROOT_INO, "old").await.unwrap().ino;
    let h = fs.open(old, W).await.unwrap();
    assert!(matches!(h.io, KernelIo::Daemon), "bytes not local");
    fs.write(h.fh, 0, b"x").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    let (attr, w) = fs.create(ROOT_INO, "new").await.unwrap();
    backing(&w).write_all_at(b"abc", 0).unwrap();
    fs.flush(w.fh).await.unwrap();
    fs.release(w.fh).await;
    // Its version waits for the bucket: the next open (and one beside it) through the daemon.
    let a = fs.open(attr.ino, W).await.unwrap();
    let b = fs.open(attr.ino, R).await.unwrap();
    assert!(matches!(a.io, KernelIo::Daemon));
    assert!(matches!(b.io, KernelIo::Daemon));
    fs.write(a.fh, 3, b"def").await.unwrap();
    fs.flush(a.fh).await.unwrap();
    fs.release(a.fh).await;
    fs.release(b.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("new").unwrap()[..], b"abcdef");
    let mut want = vec![5u8; 10_000];
    want[0] = b'x';
    assert_eq!(store.object_bytes("old").unwrap(), want);
}

/// A power cut (another boot) after the kernel wrote a file and a close journaled it: if no
/// commit synced the file since, its bytes are not trusted (they may be cut short, as here),
/// and the bucket keeps its last whole version; once a commit did, the file is taken as the
/// disk kept it.
#[test]
fn after_a_power_cut_a_file_written_in_place_counts_only_once_committed() {
    for committed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("c");
        let store = Arc::new(MemoryStore::new());
        store.insert("f", b"old and whole".to_vec());
        let new = vec![6u8; 80_000];
        let rt = || paused_runtime();
        crate::platform::set_boot_id(Some("before".into()));
        let staged = rt().block_on(async {
            let fs = mount(&store, wcfg(&cache, Duration::from_secs(3600)));
            let ino = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
            let w = fs.open(ino, super::tests::WT).await.unwrap();
            let file = backing(&w);
            file.write_all_at(&new, 0).unwrap();
            fs.flush(w.fh).await.unwrap();
            if committed {
                tokio::time::sleep(Duration::from_millis(1100)).await;
            }
            let staged = fs.power_cut_exposure().unwrap().files;
            drop(fs);
            staged
        });
        assert_eq!(
            staged.len(),
            usize::from(!committed),
            "committed {committed}"
        );
        // The cut: the file lost its tail (it was never synced, or the in-place edits after
        // the commit are what is lost).
        let path = std::fs::read_dir(cache.join("staging"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| std::fs::metadata(p).unwrap().len() == new.len() as u64)
            .expect("the staging file");
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(1000).unwrap();
        drop(f);
        crate::platform::set_boot_id(Some("after".into()));
        rt().block_on(async {
            let fs = mount(&store, wcfg(&cache, Duration::ZERO));
            fs.start().await.unwrap();
            assert_eq!(fs.drain(false).await, 0);
        });
        crate::platform::set_boot_id(None);
        let want = match committed {
            true => new[..1000].to_vec(),
            false => b"old and whole".to_vec(),
        };
        assert_eq!(
            store.object_bytes("f").unwrap(),
            want,
            "committed {committed}"
        );
    }
}

/// A close that fails (the journal could not take its line) while the kernel still writes the
/// file: the version an earlier close sealed without its CRC32C is the same file, changed
/// since, so it is kept as not saved with the failed change (I10), not left waiting for a seal
/// that never comes (which kept an unmount waiting for ever). A later close saves it all.
#[tokio::test(start_paused = true)]
async fn a_failed_close_keeps_the_unsealed_version_not_saved_and_unmount_ends() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, wcfg(&dir.path().join("c"), Duration::ZERO));
    let (attr, w) = fs.create(ROOT_INO, "f").await.unwrap();
    let file = backing(&w);
    let r = fs.open(attr.ino, R).await.unwrap();
    file.write_all_at(&[1u8; 20_000], 0).unwrap();
    fs.flush(w.fh).await.unwrap();
    file.write_all_at(&[2u8; 5_000], 20_000).unwrap();
    let wb = fs.write.as_ref().unwrap().clone();
    wb.fail_journal_appends(1);
    assert!(fs.flush(w.fh).await.is_err(), "the close fails");
    fs.release(w.fh).await;
    fs.release(r.fh).await;
    let left = tokio::time::timeout(Duration::from_secs(600), fs.drain(true))
        .await
        .expect("the unmount's drain ends");
    assert_eq!(left, 0, "nothing left to upload");
    assert!(
        store.object_bytes("f").is_none(),
        "nothing of a file whose last close failed is uploaded (I10)"
    );
    assert_eq!(
        fs.write.as_ref().unwrap().status().await.held_files,
        1,
        "reported as not saved"
    );
    // A later close saves every byte.
    let w = fs.open(attr.ino, W).await.unwrap();
    fs.flush(w.fh).await.unwrap();
    fs.release(w.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    let mut want = vec![1u8; 20_000];
    want.extend_from_slice(&[2u8; 5_000]);
    assert_eq!(store.object_bytes("f").unwrap(), want);
}

/// A handle that joins the file's passthrough handles is counted before it reaches the item;
/// when the last other handle is released in between, the item keeps passing through for
/// it, so a truncate meanwhile cuts the file that handle writes, not a copy of it.
#[tokio::test(start_paused = true)]
async fn a_release_before_a_joiner_reaches_the_item_keeps_it_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(
        &store,
        wcfg(&dir.path().join("c"), Duration::from_secs(3600)),
    );
    let (attr, w) = fs.create(ROOT_INO, "f").await.unwrap();
    let file = backing(&w);
    file.write_all_at(&[7u8; 10_000], 0).unwrap();
    fs.flush(w.fh).await.unwrap();
    // The joiner, counted by the inode but not yet at the item (its open is midway).
    let wb = fs.write.as_ref().unwrap().clone();
    let (io, counted) = fs
        .pt
        .staged_open(attr.ino, || async { None }, |_| async {})
        .await
        .unwrap();
    assert!(matches!(io, KernelIo::Passthrough(_)) && counted == Counted::Through);
    let item = wb.open_existing("f").await.unwrap();
    fs.release(w.fh).await;
    // A truncate in between: in place, as the joiner's writes will be.
    fs.setattr(attr.ino, Some(4_000), None, None).await.unwrap();
    wb.join_passthrough(&item, file.clone(), attr.ino, None)
        .await;
    file.write_all_at(&[8u8; 1_000], 4_000).unwrap();
    assert_eq!(fs.getattr(attr.ino).await.unwrap().size, 5_000);
    wb.commit(&item).await.unwrap();
    fs.pt.release(attr.ino, Counted::Through);
    wb.leave_passthrough(&item, || fs.pt.passing_through(attr.ino))
        .await;
    wb.release(&item).await;
    assert_eq!(fs.drain(false).await, 0);
    let mut want = vec![7u8; 4_000];
    want.extend_from_slice(&[8u8; 1_000]);
    assert_eq!(store.object_bytes("f").unwrap(), want);
}

/// I10 for writes bucketdrive does not see: with the cache disk nearly full, a write the
/// kernel made may have failed (only the writer was told), so the file is held: its close
/// fails with ENOSPC, and nothing of it replaces the object, though the file looks unchanged.
/// A nearly full disk hands no file to the kernel; a rewrite once there is room saves it.
#[tokio::test(start_paused = true)]
async fn a_nearly_full_cache_disk_holds_a_file_the_kernel_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (store, fs, f) = over_good_object(&dir, Duration::ZERO).await;
    let wb = fs.write.as_ref().unwrap().clone();
    let w = fs.open(f, WT).await.unwrap();
    assert!(matches!(w.io, KernelIo::Passthrough(_)), "first open");
    let file = backing(&w);
    // The writer's first write failed for space: the file stays empty.
    wb.pretend_free_bytes(Some(1 << 20));
    assert!(matches!(fs.flush(w.fh).await, Err(FsError::NoSpace)));
    fs.release(w.fh).await;
    assert_eq!(fs.drain(true).await, 0);
    assert_eq!(
        &store.object_bytes("f").unwrap()[..],
        b"the good object",
        "the object keeps its last whole version (I10)"
    );
    assert_eq!(wb.status().await.held_files, 1);
    // No passthrough while the disk is nearly full.
    let w = fs.open(f, WT).await.unwrap();
    assert!(matches!(w.io, KernelIo::Daemon));
    fs.release(w.fh).await;
    // Room again: a rewrite saves it (through bucketdrive: changes are kept as not saved).
    wb.pretend_free_bytes(None);
    drop(file);
    let w = fs.open(f, WT).await.unwrap();
    assert!(matches!(w.io, KernelIo::Daemon));
    fs.write(w.fh, 0, b"new bytes").await.unwrap();
    fs.flush(w.fh).await.unwrap();
    fs.release(w.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"new bytes");
}

/// A cache disk that fills while the kernel writes a file and is freed again before the
/// file's close (a write may have failed; only the writer was told): the watch of the disk's
/// free space saw it, so the close fails with ENOSPC and the object keeps its last whole
/// version (I10), as when the close itself finds the disk full. A file begun after the dip
/// is saved as any.
#[tokio::test(start_paused = true)]
async fn a_disk_full_and_freed_again_between_two_looks_holds_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (store, fs, f) = over_good_object(&dir, Duration::ZERO).await;
    let wb = fs.write.as_ref().unwrap().clone();
    let w = fs.open(f, WT).await.unwrap();
    assert!(matches!(w.io, KernelIo::Passthrough(_)));
    backing(&w).write_all_at(b"the new", 0).unwrap();
    wb.pretend_free_bytes(Some(1 << 20));
    // The watch runs on a thread of its own, in real time.
    std::thread::sleep(crate::write::space_watch::POLL_MAX * 3);
    wb.pretend_free_bytes(None);
    assert!(matches!(fs.flush(w.fh).await, Err(FsError::NoSpace)));
    assert!(
        matches!(fs.flush(w.fh).await, Err(FsError::NoSpace)),
        "held until written over whole"
    );
    // Written over whole by the handle open across the dip: saved (the dip is acted on once).
    fs.setattr(f, Some(0), None, Some(w.fh)).await.unwrap();
    backing(&w).write_all_at(b"written over", 0).unwrap();
    fs.flush(w.fh).await.unwrap();
    fs.release(w.fh).await;
    assert_eq!(fs.drain(true).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"written over");
    // Another dip, another file held.
    let w = fs.open(f, WT).await.unwrap();
    assert!(matches!(w.io, KernelIo::Passthrough(_)));
    backing(&w).write_all_at(b"the new", 0).unwrap();
    wb.pretend_free_bytes(Some(1 << 20));
    // The watch runs on a thread of its own, in real time.
    std::thread::sleep(crate::write::space_watch::POLL_MAX * 3);
    wb.pretend_free_bytes(None);
    assert!(matches!(fs.flush(w.fh).await, Err(FsError::NoSpace)));
    fs.release(w.fh).await;
    assert_eq!(fs.drain(true).await, 0);
    assert_eq!(
        &store.object_bytes("f").unwrap()[..],
        b"written over",
        "the object keeps its last whole version (I10)"
    );
    assert_eq!(wb.status().await.held_files, 1);
    let (_, g) = fs.create(ROOT_INO, "g").await.unwrap();
    backing(&g).write_all_at(b"after", 0).unwrap();
    // The watch runs on a thread of its own, in real time.
    std::thread::sleep(crate::write::space_watch::POLL_MAX * 3);
    fs.flush(g.fh).await.unwrap();
    fs.release(g.fh).await;
    assert_eq!(fs.drain(true).await, 0);
    assert_eq!(&store.object_bytes("g").unwrap()[..], b"after");
}

/// The mount frees space itself (an upload done, a file deleted or cut) most often when the
/// disk is full, and a free can end the dip that failed a write the kernel made: so the watch
/// looks before every free on the cache disk, and the dip is seen though no poll ran in it.
#[tokio::test(start_paused = true)]
async fn a_dip_the_mount_ends_itself_is_seen_before_the_free() {
    let dir = tempfile::tempdir().unwrap();
    let (store, fs, f) = over_good_object(&dir, Duration::ZERO).await;
    let wb = fs.write.as_ref().unwrap().clone();
    let staging = wb.staging_dir().clone();
    // The mount frees a file of its own on the cache disk.
    let free = || {
        staging.at("other").replace_with(b"x").unwrap();
        staging.at("other").remove().unwrap();
    };
    let w = fs.open(f, WT).await.unwrap();
    assert!(matches!(w.io, KernelIo::Passthrough(_)));
    backing(&w).write_all_at(b"the new", 0).unwrap();
    // Freed with room to spare: no dip.
    free();
    // Full (a write failed), and the mount's own free ends it: no poll ran meanwhile.
    wb.pretend_free_bytes(Some(1 << 20));
    free();
    wb.pretend_free_bytes(None);
    assert!(matches!(fs.flush(w.fh).await, Err(FsError::NoSpace)));
    fs.release(w.fh).await;
    assert_eq!(fs.drain(true).await, 0);
    assert_eq!(
        &store.object_bytes("f").unwrap()[..],
        b"the good object",
        "the object keeps its last whole version (I10)"
    );
    // A file begun after it, with frees while the disk has room, is saved.
    let (_, g) = fs.create(ROOT_INO, "g").await.unwrap();
    backing(&g).write_all_at(b"after", 0).unwrap();
    free();
    fs.flush(g.fh).await.unwrap();
    fs.release(g.fh).await;
    assert_eq!(fs.drain(true).await, 0);
    assert_eq!(&store.object_bytes("g").unwrap()[..], b"after");
}

/// A shared mapping of the backing file (the kernel maps it for a passthrough handle) that
/// outlives every handle and the upload: the item stays while the process maps the file, a
/// store through it is uploaded as a new version, and the item retires once it is unmapped.
#[tokio::test(start_paused = true)]
async fn a_store_through_a_mapping_after_the_upload_is_uploaded_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, wcfg(&dir.path().join("c"), Duration::ZERO));
    let (_, bytes) = mapped_and_closed(&fs).await;
    followed_until_unmapped(&fs, &store, bytes).await;
}

/// Where the kernel cannot tell (no leases on the cache disk's file system), the processes
/// that opened the file are asked: the opener's shared mapping keeps the item, a store through
/// it after the upload is uploaded, and the item retires once it is unmapped.
#[tokio::test(start_paused = true)]
async fn without_leases_the_openers_mapping_is_found_in_proc() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, wcfg(&dir.path().join("c"), Duration::ZERO));
    let wb = fs.write.as_ref().unwrap().clone();
    wb.no_leases
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (_, bytes) = mapped_and_closed(&fs).await;
    followed_until_unmapped(&fs, &store, bytes).await;
}

/// A mapping held by a process other than the one that opened the file (a child it handed
/// the mapping to, outliving it) keeps the file too: the kernel tells that the file is still
/// open, where the opener's `/proc/<pid>/maps` shows nothing. A store after the upload is
/// uploaded, and the item retires once the mapping is gone.
#[tokio::test(start_paused = true)]
async fn a_mapping_not_the_openers_keeps_the_file_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let probe = std::fs::File::create(dir.path().join("probe")).unwrap();
    if crate::platform::opened_elsewhere(&probe).is_none() {
        eprintln!("no leases on the test's file system: the kernel cannot tell, skipped");
        return;
    }
    let fs = mount(&store, wcfg(&dir.path().join("c"), Duration::ZERO));
    // Process 1 opened it, and maps nothing of ours.
    let (_, bytes) = mapped_and_closed_by(&fs, 1).await;
    followed_until_unmapped(&fs, &store, bytes).await;
}

/// Two releases whose halves interleave (the inode's count, then the item's): the last to
/// reach the item lets passthrough go, as nothing is left to join, so a later writer through
/// bucketdrive edits a copy and its write, never closed, is not uploaded.
#[tokio::test(start_paused = true)]
async fn interleaved_releases_let_passthrough_go() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(
        &store,
        wcfg(&dir.path().join("c"), Duration::from_secs(3600)),
    );
    let wb = fs.write.as_ref().unwrap().clone();
    let (attr, a) = fs.create(ROOT_INO, "f").await.unwrap();
    let file = backing(&a);
    let b = fs.open(attr.ino, W).await.unwrap();
    file.write_all_at(&[7u8; 10_000], 0).unwrap();
    fs.flush(a.fh).await.unwrap();
    let fa = fs.files.lock().remove(&a.fh).unwrap();
    let fb = fs.files.lock().remove(&b.fh).unwrap();
    let item = match &fa.io {
        FileIo::Staged { item, .. } => item.clone(),
        FileIo::Read(_) => unreachable!(),
    };
    let others = || fs.pt.passing_through(attr.ino);
    fs.pt.release(attr.ino, Counted::Through); // A, its first half
    fs.pt.release(attr.ino, Counted::Through); // B, whole
    wb.leave_passthrough(&item, others).await;
    wb.release(&item).await;
    wb.leave_passthrough(&item, others).await; // A, its second half
    wb.release(&item).await;
    drop((fa, fb));
    let w = fs.open(attr.ino, W).await.unwrap();
    assert!(matches!(w.io, KernelIo::Daemon));
    fs.write(w.fh, 0, &[9u8; 100]).await.unwrap(); // never closed
    let _ = tokio::time::timeout(Duration::from_secs(60), fs.drain(false)).await;
    let got = store.object_bytes("f").expect("uploaded");
    assert!(
        got[..] == [7u8; 10_000][..],
        "an unclosed write reached the bucket: {:?}..",
        &got[..4]
    );
    fs.release(w.fh).await;
}

/// A file held (I10) whose pending version is the same file, sealed with its CRC32C (an
/// fsync whose upload failed), and written in place since: the upload finds the bytes
/// changed and must not take the file as it is now, which holds the failed change; nor may a
/// replay after a crash. The bucket keeps a whole version: the old object or the fsync'd one.
#[test]
fn a_held_file_is_not_uploaded_through_a_reseal_nor_a_replay() {
    for crash in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("c");
        let store = Arc::new(MemoryStore::new());
        store.insert("f", b"the good object".to_vec());
        let rt = paused_runtime();
        rt.block_on(async {
            let fs = mount(&store, wcfg(&cache, Duration::ZERO));
            let wb = fs.write.as_ref().unwrap().clone();
            let a = fs.lookup(ROOT_INO, "f").await.unwrap();
            let wt = OpenMode {
                write: true,
                truncate: true,
                process: None,
            };
            let w = fs.open(a.ino, wt).await.unwrap();
            let file = backing(&w);
            file.write_all_at(&[1u8; 20_000], 0).unwrap();
            store.set_offline(true);
            assert!(fs.fsync(w.fh).await.is_err(), "its upload fails");
            wb.pretend_free_bytes(Some(1 << 20));
            file.write_all_at(&[2u8; 4096], 0).unwrap(); // a write that landed in part
            assert!(matches!(fs.flush(w.fh).await, Err(FsError::NoSpace)));
            fs.release(w.fh).await;
            assert_eq!(wb.status().await.held_files, 1);
            if crash {
                drop(fs);
                return;
            }
            store.set_offline(false);
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        rt.shutdown_timeout(Duration::from_secs(5));
        if crash {
            let rt = paused_runtime();
            rt.block_on(async {
                store.set_offline(false);
                let fs = mount(&store, wcfg(&cache, Duration::ZERO));
                fs.start().await.unwrap();
                let _ = tokio::time::timeout(Duration::from_secs(600), fs.drain(true)).await;
            });
        }
        let got = store.object_bytes("f").unwrap();
        assert!(
            got[..] == b"the good object"[..] || got[..] == [1u8; 20_000][..],
            "crash={crash}: the bucket got the held file's failed write: {:?}..",
            &got[..8]
        );
    }
}

/// The rest of a mapping's story once `f` is mapped (`bytes`) and closed with `one ` stored
/// through the mapping: the upload brings `one `; a store of `two ` after it is seen at the
/// next look and uploaded as a new version; and once unmapped, the item retires.
async fn followed_until_unmapped(
    fs: &Filesystem<MemoryStore>,
    store: &MemoryStore,
    bytes: &'static mut [u8],
) {
    let drained = || async {
        tokio::time::timeout(Duration::from_secs(600), fs.drain(false))
            .await
            .expect("drain ends")
    };
    assert_eq!(drained().await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..4], b"one ");
    bytes[..4].copy_from_slice(b"two ");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(drained().await, 0);
    let got = store.object_bytes("f").unwrap();
    assert_eq!(
        (&got[..4], got.len()),
        (&b"two "[..], 8192),
        "the store through the mapping after the upload is uploaded"
    );
    unmap(bytes);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let wb = fs.write.as_ref().unwrap();
    assert!(
        wb.item("f").is_none(),
        "the item retires once the mapping is gone"
    );
}

/// A new file `f` (inode returned) opened by this process passing through, 8 KiB long, mapped
/// shared (the mapping returned) and `one ` stored through the mapping, then closed and
/// released: the mapping outlives every handle.
async fn mapped_and_closed(fs: &Filesystem<MemoryStore>) -> (u64, &'static mut [u8]) {
    mapped_and_closed_by(fs, std::process::id()).await
}

/// As [`mapped_and_closed`], opened by process `opener` (the mapping is this process's all the
/// same: a child's, its parent the opener).
async fn mapped_and_closed_by(
    fs: &Filesystem<MemoryStore>,
    opener: u32,
) -> (u64, &'static mut [u8]) {
    let me = CreateFlags {
        process: Some(opener),
        ..CreateFlags::default()
    };
    let (attr, h) = fs.create_with(ROOT_INO, "f", me).await.unwrap();
    let file = backing(&h);
    file.set_len(8192).unwrap();
    let bytes = map_shared(&file, 8192);
    bytes[..4].copy_from_slice(b"one ");
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    (attr.ino, bytes)
}

/// Maps `file` shared, `len` bytes (a test standing in for a process's mapping): through an
/// open of its own, as the kernel maps a passthrough handle through the backing file it
/// opened for that handle, never through the daemon's open.
fn map_shared(file: &std::fs::File, len: usize) -> &'static mut [u8] {
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    let own = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{fd}"))
        .unwrap();
    // SAFETY: a shared mapping of a file the test owns, of its length; unmapped by `unmap`.
    // The mapping keeps its open alive after `own` is dropped.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&own),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    // SAFETY: within the mapping, which lives until `unmap`.
    unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), len) }
}

fn unmap(bytes: &mut [u8]) {
    // SAFETY: a mapping made by `map_shared`, no longer used.
    assert_eq!(
        unsafe { libc::munmap(bytes.as_mut_ptr().cast(), bytes.len()) },
        0
    );
}

/// A store through a mapping while the upload is under way (after it read and checked the
/// bytes), and the mapping gone before the upload ends: the file moved since the engine's
/// last look, so the item stays, the store is sealed as a new version and uploaded.
#[tokio::test(start_paused = true)]
async fn a_store_during_the_upload_is_uploaded_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, wcfg(&dir.path().join("c"), Duration::ZERO));
    let wb = fs.write.as_ref().unwrap().clone();
    let (_, bytes) = mapped_and_closed(&fs).await;
    // The upload's answer comes late: its bytes are in the bucket, the upload not yet over.
    store.set_faults(Some(crate::store::memory::FaultConfig::delays(
        3,
        Duration::from_secs(20),
    )));
    for _ in 0..100_000 {
        if store.object_bytes("f").is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(&store.object_bytes("f").expect("uploaded")[..4], b"one ");
    assert!(wb.item("f").is_some(), "the upload is still under way");
    bytes[..4].copy_from_slice(b"two ");
    unmap(bytes);
    assert_eq!(fs.drain(false).await, 0);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..4], b"two ");
    assert!(wb.item("f").is_none(), "then the item retires");
}

/// An unmount's drain that comes while the watch has found a store through the mapping but
/// not yet begun to save it (it takes the item's lock again to commit): the drain saves the
/// change itself and waits for its upload, instead of taking the file for done.
#[tokio::test(start_paused = true)]
async fn a_drain_between_the_watchs_look_and_its_save_saves_the_change() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, wcfg(&dir.path().join("c"), Duration::ZERO));
    let wb = fs.write.as_ref().unwrap().clone();
    let (_, bytes) = mapped_and_closed(&fs).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..4], b"one ");
    let gate = Arc::new(tokio::sync::Barrier::new(2));
    *wb.mapped_save_gate.lock() = Some(gate.clone());
    bytes[..4].copy_from_slice(b"two ");
    // The watch's next look finds the store and stops before its save.
    tokio::time::timeout(Duration::from_secs(60), gate.wait())
        .await
        .expect("the watch looks");
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(600), fs.drain(false))
            .await
            .expect("drain ends"),
        0
    );
    assert_eq!(
        &store.object_bytes("f").unwrap()[..4],
        b"two ",
        "the drain ended with the change in the bucket"
    );
    gate.wait().await;
    *wb.mapped_save_gate.lock() = None;
    unmap(bytes);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..4], b"two ");
}

/// A writer through bucketdrive that opens a watched file between the watch's look (which
/// found a store through the mapping) and its save: the save is left to the writer's close,
/// so nothing the writer has not closed is uploaded.
#[tokio::test(start_paused = true)]
async fn a_writer_opened_between_the_watchs_look_and_its_save_is_not_uploaded() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, wcfg(&dir.path().join("c"), Duration::ZERO));
    let wb = fs.write.as_ref().unwrap().clone();
    let (ino, bytes) = mapped_and_closed(&fs).await;
    assert_eq!(fs.drain(false).await, 0);
    let gate = Arc::new(tokio::sync::Barrier::new(2));
    *wb.mapped_save_gate.lock() = Some(gate.clone());
    bytes[..4].copy_from_slice(b"two ");
    tokio::time::timeout(Duration::from_secs(60), gate.wait())
        .await
        .expect("the watch looks");
    // Through bucketdrive (less than 1 GiB free hands no file to the kernel).
    wb.pretend_free_bytes(Some(512 << 20));
    let w = fs.open(ino, W).await.unwrap();
    assert!(matches!(w.io, KernelIo::Daemon));
    fs.write(w.fh, 100, b"half").await.unwrap();
    gate.wait().await;
    *wb.mapped_save_gate.lock() = None;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let got = store.object_bytes("f").unwrap();
    assert_eq!(
        (&got[..4], &got[100..104]),
        (&b"one "[..], &[0u8; 4][..]),
        "nothing is uploaded while the writer has the file open"
    );
    fs.flush(w.fh).await.unwrap();
    fs.release(w.fh).await;
    unmap(bytes);
    assert_eq!(fs.drain(false).await, 0);
    let got = store.object_bytes("f").unwrap();
    assert_eq!((&got[..4], &got[100..104]), (&b"two "[..], &b"half"[..]));
}

/// A writer through bucketdrive on a file being watched (a mapping outlived its handles):
/// the watch does not upload what that writer has not closed.
#[tokio::test(start_paused = true)]
async fn a_watched_file_is_not_uploaded_while_a_writer_has_it_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, wcfg(&dir.path().join("c"), Duration::ZERO));
    let (ino, bytes) = mapped_and_closed(&fs).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..4], b"one ");
    // A writer beside the mapping, through bucketdrive (the mapping keeps the item; less
    // than 1 GiB free on the cache disk hands no file to the kernel).
    fs.write
        .as_ref()
        .unwrap()
        .pretend_free_bytes(Some(512 << 20));
    let w = fs.open(ino, W).await.unwrap();
    assert!(matches!(w.io, KernelIo::Daemon));
    fs.write(w.fh, 100, b"half-written").await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        &store.object_bytes("f").unwrap()[100..112],
        &[0u8; 12],
        "nothing of an open writer's changes is uploaded"
    );
    fs.flush(w.fh).await.unwrap();
    fs.release(w.fh).await;
    unmap(bytes);
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[100..112], b"half-written");
}

/// The cache disk fails to write back a file the kernel wrote, after its last release (the
/// commit's `fdatasync` is told, once: a second sync, on a new descriptor, would succeed).
/// While the page cache keeps what was written, the upload finds the bytes the version was
/// sealed with and the file reaches the bucket exactly; once it shows what the disk holds
/// instead, the file is never uploaded (not taken for a store through a mapping): the bucket
/// keeps its last whole version, and the file is held, not saved, until written over whole.
#[tokio::test(start_paused = true)]
async fn a_write_back_the_disk_failed_is_uploaded_only_as_it_was_written() {
    for lost in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (store, fs, f) = over_good_object(&dir, Duration::from_secs(10)).await;
        let wb = fs.write.as_ref().unwrap().clone();
        let w = fs.open(f, WT).await.unwrap();
        let file = backing(&w);
        file.write_all_at(b"bytes written", 0).unwrap();
        wb.fail_data_syncs(1);
        fs.flush(w.fh).await.unwrap();
        fs.release(w.fh).await;
        // The commit comes (and fails) within one interval; the upload later.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(store
            .object_bytes("f")
            .is_some_and(|b| &b[..] == b"the good object"));
        if lost {
            // What a read finds once the page cache let go of the pages the disk lost.
            file.write_all_at(&[0u8; 13], 0).unwrap();
        }
        assert_eq!(fs.drain(true).await, 0);
        let status = wb.status().await;
        if !lost {
            assert_eq!(&store.object_bytes("f").unwrap()[..], b"bytes written");
            assert_eq!(status.held_files, 0);
            continue;
        }
        assert_eq!(
            &store.object_bytes("f").unwrap()[..],
            b"the good object",
            "the object keeps its last whole version (I10)"
        );
        assert_eq!((status.held_files, status.uploaded_files), (1, 0));
        // Written over whole: saved.
        let w = fs.open(f, WT).await.unwrap();
        fs.write(w.fh, 0, b"written again").await.unwrap();
        fs.flush(w.fh).await.unwrap();
        fs.release(w.fh).await;
        assert_eq!(fs.drain(false).await, 0);
        assert_eq!(&store.object_bytes("f").unwrap()[..], b"written again");
    }
}

/// A crash after a commit found that the disk failed to write back a file the kernel wrote,
/// before its upload: the journal says so, and the next mount uploads the file only as it was
/// written (its bytes checked against the CRC32C it was sealed with), never what the disk holds
/// instead, which is set aside as damaged.
#[test]
fn a_replay_knows_of_a_write_back_the_disk_failed() {
    for lost in [false, true] {
        replay_after_a_failed_write_back(lost);
    }
}

fn replay_after_a_failed_write_back(lost: bool) {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("c");
    let store = Arc::new(MemoryStore::new());
    store.insert("f", b"the good object".to_vec());
    let rt = paused_runtime();
    let file = rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::from_secs(3600)));
        let a = fs.lookup(ROOT_INO, "f").await.unwrap();
        let w = fs.open(a.ino, WT).await.unwrap();
        let file = backing(&w);
        file.write_all_at(b"bytes written", 0).unwrap();
        fs.write.as_ref().unwrap().fail_data_syncs(1);
        fs.flush(w.fh).await.unwrap();
        fs.release(w.fh).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        // The crash: no drain.
        drop(fs);
        file
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    if lost {
        // What the disk holds, once the page cache let go of what was written.
        file.write_all_at(&[0u8; 13], 0).unwrap();
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fs = mount(&store, wcfg(&cache, Duration::ZERO));
        assert_eq!(fs.start().await.unwrap(), usize::from(!lost));
        assert_eq!(fs.drain(true).await, 0);
    });
    if !lost {
        assert_eq!(&store.object_bytes("f").unwrap()[..], b"bytes written");
        return;
    }
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"the good object");
    let damaged = walkdir(&cache)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".damaged"))
        .count();
    assert_eq!(damaged, 1, "set aside as damaged");
}

/// Every file under `dir`.
fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        match p.is_dir() {
            true => out.extend(walkdir(&p)),
            false => out.push(p),
        }
    }
    out
}

/// An edit of a file the kernel wrote, whose write-back the disk failed, before its upload: the
/// edit would copy bytes that may be what the disk holds into a new working copy, so it fails
/// (EIO) and the file is held; written over whole, it is saved.
#[tokio::test(start_paused = true)]
async fn an_edit_of_a_file_the_disk_failed_waits_for_a_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let (store, fs, f) = over_good_object(&dir, Duration::from_secs(10)).await;
    let w = fs.open(f, WT).await.unwrap();
    let file = backing(&w);
    file.write_all_at(b"bytes written", 0).unwrap();
    fs.write.as_ref().unwrap().fail_data_syncs(1);
    fs.flush(w.fh).await.unwrap();
    fs.release(w.fh).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // What the disk holds, once the page cache let go of what was written.
    file.write_all_at(&[0u8; 13], 0).unwrap();
    let e = fs.open(f, W).await.unwrap();
    assert!(matches!(e.io, KernelIo::Daemon), "a version is pending");
    let wrote = fs.write(e.fh, 0, b"B").await;
    assert!(matches!(wrote, Err(FsError::Io(_))), "{wrote:?}");
    fs.release(e.fh).await;
    assert_eq!(fs.drain(true).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"the good object");
    let w = fs.open(f, WT).await.unwrap();
    fs.write(w.fh, 0, b"written again").await.unwrap();
    fs.flush(w.fh).await.unwrap();
    fs.release(w.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"written again");
}

/// A write-back the disk failed while the file was open (the engine's own descriptor is told
/// at the close): the close fails with EIO and nothing of the file is uploaded.
#[tokio::test(start_paused = true)]
async fn a_write_back_the_disk_failed_while_open_fails_the_close() {
    let dir = tempfile::tempdir().unwrap();
    let (store, fs, f) = over_good_object(&dir, Duration::ZERO).await;
    let wb = fs.write.as_ref().unwrap().clone();
    let w = fs.open(f, WT).await.unwrap();
    assert!(matches!(w.io, KernelIo::Passthrough(_)));
    backing(&w).write_all_at(b"bytes the disk lost", 0).unwrap();
    wb.fail_writeback_looks(1);
    let closed = fs.flush(w.fh).await;
    assert!(matches!(closed, Err(FsError::Io(_))), "{closed:?}");
    fs.release(w.fh).await;
    assert_eq!(fs.drain(true).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"the good object");
    assert_eq!(wb.status().await.held_files, 1);
}
