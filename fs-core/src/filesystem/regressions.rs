//! Regressions for the write-path failures users hit through the mount (cases 1-3 of the
//! write-path reliability issue), reproduced in the core against `MemoryStore`. Each asserts
//! the bytes in the bucket, not just success.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::namespace::ROOT_INO;
use crate::store::memory::MemoryStore;
use crate::write::upload::UploadConfig;

fn wcfg(cache: &std::path::Path, delay: Duration) -> WriteConfig {
    let mut w = WriteConfig::new(cache.to_path_buf());
    w.write_back_delay = delay;
    w.retry_initial = Duration::from_millis(5);
    w.retry_max = Duration::from_millis(20);
    w.upload = UploadConfig {
        single_shot_threshold: 64 * 1024,
        part_size: 16 * 1024,
        ..UploadConfig::default()
    };
    w
}

fn mount(
    store: &Arc<MemoryStore>,
    cache: &std::path::Path,
    delay: Duration,
) -> Filesystem<MemoryStore> {
    Filesystem::with_write(store.clone(), MountConfig::new("bkt"), wcfg(cache, delay)).unwrap()
}

use super::tests::{read_all, W, WT};

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(seed).wrapping_add(seed >> 1))
        .collect()
}

fn temp_parts(store: &MemoryStore) -> Vec<String> {
    store
        .keys()
        .into_iter()
        .filter(|k| k.starts_with(TEMP_DIR) || k.contains(".conflict-"))
        .collect()
}

/// Case 1: a composite upload fails part-way, the user rewrites the file through a handle
/// held open, the link returns: the bucket gets the new version whole (never a mix of old
/// and new parts), the upload finishes, and no part is left behind.
#[tokio::test]
async fn rewrite_during_a_failing_composite_upload_is_never_mixed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, &dir.path().join("c"), Duration::ZERO);
    let old = bytes(200_000, 3);
    let new = bytes(200_000, 7);
    let (attr, h) = fs.create(ROOT_INO, "big").await.unwrap();
    fs.write(h.fh, 0, &old).await.unwrap();
    // Some parts of the old version go up, then the link drops.
    fs.flush(h.fh).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2)).await;
    store.fail_next(u64::MAX);
    tokio::time::sleep(Duration::from_millis(30)).await;
    // Rewritten through the handle still open: same size, every byte different.
    fs.write(h.fh, 0, &new).await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    assert_eq!(
        read_all(&fs, attr.ino).await,
        new,
        "readers see the new bytes"
    );
    store.fail_next(0);
    let drained = tokio::time::timeout(Duration::from_secs(30), fs.drain(false)).await;
    assert_eq!(drained, Ok(0), "the upload finishes once the link is back");
    assert_eq!(store.object_bytes("big").unwrap(), new);
    assert!(temp_parts(&store).is_empty(), "{:?}", temp_parts(&store));

    // And with a shorter rewrite, parts of the longer old version can never be composed in.
    let h = fs.open(attr.ino, W).await.unwrap();
    store.fail_next(u64::MAX);
    fs.write(h.fh, 0, &old[..150_000]).await.unwrap();
    fs.setattr(attr.ino, Some(150_000), None, Some(h.fh))
        .await
        .unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    store.fail_next(0);
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(store.object_bytes("big").unwrap(), &old[..150_000]);
    assert!(temp_parts(&store).is_empty(), "{:?}", temp_parts(&store));
}

/// Case 2: a file written and closed, reopened and appended to (or emptied and rewritten),
/// never closed again, and the daemon dies. The next mount uploads exactly the closed version:
/// never nothing, never less.
#[test]
fn a_closed_version_survives_a_crash_in_the_middle_of_the_next_edit() {
    for (truncate, name) in [(false, "appended"), (true, "rewritten")] {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("c");
        let store = Arc::new(MemoryStore::new());
        let closed = bytes(100_000, 5);
        {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let fs = mount(&store, &cache, Duration::from_secs(3600));
                let (attr, h) = fs.create(ROOT_INO, name).await.unwrap();
                fs.write(h.fh, 0, &closed).await.unwrap();
                fs.flush(h.fh).await.unwrap();
                fs.release(h.fh).await;
                let mode = if truncate { WT } else { W };
                let h = fs.open(attr.ino, mode).await.unwrap();
                let at = if truncate { 0 } else { closed.len() as u64 };
                fs.write(h.fh, at, &bytes(30_000, 9)).await.unwrap();
                // No flush, no release: the daemon is killed here.
                drop(fs);
            });
            rt.shutdown_timeout(Duration::from_secs(5));
        }
        assert!(store.object_bytes(name).is_none(), "nothing uploaded yet");
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let fs = mount(&store, &cache, Duration::ZERO);
            assert_eq!(fs.start().await.unwrap(), 1, "{name}");
            let attr = fs.lookup(ROOT_INO, name).await.unwrap();
            assert_eq!(
                read_all(&fs, attr.ino).await,
                closed,
                "{name}: the mount shows it"
            );
            assert_eq!(fs.drain(false).await, 0);
        });
        assert_eq!(store.object_bytes(name).unwrap(), closed, "{name}");
    }
}

/// Case 3: while a file's upload fails because the bucket is unreachable, the file can be
/// opened, read, overwritten and closed without a single bucket request; its upload resumes
/// when the bucket is back.
#[tokio::test]
async fn a_staged_file_is_edited_offline() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, &dir.path().join("c"), Duration::ZERO);
    let (attr, h) = fs.create(ROOT_INO, "doc").await.unwrap();
    store.fail_next(u64::MAX);
    fs.write(h.fh, 0, &bytes(300_000, 3)).await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    // The first upload attempt has failed before the edits start (its start waits for the
    // commit, on the blocking pool: no fixed sleep covers that on a loaded machine).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while store.counts.write.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no upload was tried"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let before = store.counts.total();
    let new = bytes(120_000, 11);
    let attr2 = fs.lookup(ROOT_INO, "doc").await.unwrap();
    assert_eq!(attr2.ino, attr.ino);
    let h = fs.open(attr.ino, WT).await.unwrap();
    fs.write(h.fh, 0, &new).await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    let (_, h) = fs.create(ROOT_INO, "doc").await.unwrap();
    fs.write(h.fh, 0, &new).await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    assert_eq!(read_all(&fs, attr.ino).await, new);
    assert_eq!(fs.getattr(attr.ino).await.unwrap().size, new.len() as u64);
    // Upload retries went on meanwhile; the edits themselves made no request. Count only
    // what the retries could not have made: anything at all but upload writes.
    let used = store.counts.total() - before;
    let uploads = store.counts.write.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        used <= uploads,
        "edits of a staged file asked the bucket: {used} requests"
    );
    store.fail_next(0);
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(store.object_bytes("doc").unwrap(), new);
    assert!(temp_parts(&store).is_empty(), "{:?}", temp_parts(&store));
}

/// An unlink whose bucket delete fails loses nothing: the file stays, staged, and is
/// uploaded; a later unlink that succeeds removes it for good.
#[tokio::test]
async fn a_failed_unlink_keeps_the_staged_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, &dir.path().join("c"), Duration::ZERO);
    let data = bytes(1000, 3);
    let (_, h) = fs.create(ROOT_INO, "keep").await.unwrap();
    fs.write(h.fh, 0, &data).await.unwrap();
    fs.fsync(h.fh).await.unwrap();
    fs.release(h.fh).await;
    // A second version, pending; the delete of the first fails.
    let attr = fs.lookup(ROOT_INO, "keep").await.unwrap();
    let h = fs.open(attr.ino, W).await.unwrap();
    fs.write(h.fh, 1000, b"more").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    store.fail_next(u64::MAX);
    assert!(fs.unlink(ROOT_INO, "keep").await.is_err());
    store.fail_next(0);
    assert_eq!(fs.drain(false).await, 0);
    let mut want = data.clone();
    want.extend_from_slice(b"more");
    assert_eq!(store.object_bytes("keep").unwrap(), want);
    fs.unlink(ROOT_INO, "keep").await.unwrap();
    assert_eq!(fs.drain(false).await, 0);
    assert!(store.object_bytes("keep").is_none());
}

/// Answers lost after the bucket acted (the retried request then fails its precondition) never
/// make a conflict copy, never leave a part behind, and never lose the last version.
#[tokio::test(start_paused = true)]
async fn lost_answers_make_no_conflict_copies() {
    use crate::store::memory::FaultConfig;
    for seed in 0..12u64 {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let fs = mount(&store, &dir.path().join("c"), Duration::ZERO);
        let mut want = std::collections::BTreeMap::new();
        for round in 0..3u8 {
            for (i, size) in [100usize, 70_000, 150_000].into_iter().enumerate() {
                let name = format!("f{i}");
                let data = bytes(size + round as usize, 3 + round * 2 + i as u8);
                let (_, h) = fs.create(ROOT_INO, &name).await.unwrap();
                fs.write(h.fh, 0, &data).await.unwrap();
                fs.flush(h.fh).await.unwrap();
                fs.release(h.fh).await;
                want.insert(name, data);
            }
            store.set_faults(Some(FaultConfig {
                seed: seed * 10 + round as u64,
                fail_before: 0.1,
                fail_after: 0.3,
                max_delay: Duration::from_millis(3),
            }));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        store.set_faults(None);
        assert_eq!(fs.drain(false).await, 0, "seed {seed}");
        let keys = store.keys();
        assert!(temp_parts(&store).is_empty(), "seed {seed}: {keys:?}");
        assert_eq!(keys.len(), want.len(), "seed {seed}: {keys:?}");
        for (name, data) in &want {
            assert_eq!(
                &store.object_bytes(name).unwrap()[..],
                &data[..],
                "seed {seed} {name}"
            );
        }
    }
}

/// A directory renamed away can be made again at once: nothing of the old name lingers in the
/// caches, and the files being written under it follow it.
#[tokio::test]
async fn a_directory_renamed_away_can_be_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, &dir.path().join("c"), Duration::from_secs(3600));
    let d1 = fs.mkdir(ROOT_INO, "d1").await.unwrap();
    let (_, h) = fs.create(d1.ino, "a").await.unwrap();
    fs.write(h.fh, 0, b"staged").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    // Looked at through the kernel's eyes before the rename.
    fs.lookup(ROOT_INO, "d1").await.unwrap();
    fs.lookup(d1.ino, "a").await.unwrap();
    fs.rename(ROOT_INO, "d1", ROOT_INO, "d3").await.unwrap();
    assert_eq!(
        fs.lookup(ROOT_INO, "d1").await.unwrap_err(),
        FsError::NotFound
    );
    fs.mkdir(ROOT_INO, "d1").await.unwrap();
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("d3/a").unwrap()[..], b"staged");
    assert!(store.object_bytes("d1/a").is_none());
}

/// A resumable upload whose last chunk landed but whose answer was lost, then an append: the
/// newer version must not take the older version's finished session for its own upload.
#[tokio::test]
async fn an_append_after_a_lost_final_chunk_is_uploaded() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let mut w = wcfg(&dir.path().join("c"), Duration::ZERO);
    w.upload.mode = crate::write::upload::UploadMode::Resumable;
    let fs = Filesystem::with_write(store.clone(), MountConfig::new("bkt"), w).unwrap();
    let v1 = bytes(100_000, 3);
    store.lose_final_answers(1);
    let (attr, h) = fs.create(ROOT_INO, "f").await.unwrap();
    fs.write(h.fh, 0, &v1).await.unwrap();
    fs.flush(h.fh).await.unwrap();
    for _ in 0..200 {
        if fs.write_status().await.failed_files == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(store.object_bytes("f").unwrap(), v1, "v1 landed unseen");
    fs.write(h.fh, v1.len() as u64, b"APPENDED").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    let mut v2 = v1.clone();
    v2.extend_from_slice(b"APPENDED");
    assert_eq!(read_all(&fs, attr.ino).await, v2);
    assert_eq!(
        store.object_bytes("f").unwrap(),
        v2,
        "the append reached the bucket"
    );
    assert!(temp_parts(&store).is_empty(), "{:?}", temp_parts(&store));
}

/// A damaged journal line (not a torn last one) keeps the staged data it named: the file is
/// set aside, never deleted.
#[test]
fn a_damaged_journal_line_keeps_its_staged_data() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("c");
    let store = Arc::new(MemoryStore::new());
    {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let fs = mount(&store, &cache, Duration::from_secs(3600));
            for name in ["a", "b"] {
                let (_, h) = fs.create(ROOT_INO, name).await.unwrap();
                fs.write(h.fh, 0, b"acknowledged bytes").await.unwrap();
                fs.flush(h.fh).await.unwrap();
                fs.release(h.fh).await;
            }
        });
    }
    let staged = || std::fs::read_dir(cache.join("staging")).unwrap().count();
    assert_eq!(staged(), 2);
    let log = cache.join("journal/journal.log");
    let text = std::fs::read_to_string(&log).unwrap();
    let damaged = text.replacen("\"key\":\"a\"", "\"key\":\"q\"", 1);
    assert_ne!(text, damaged);
    std::fs::write(&log, damaged).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fs = mount(&store, &cache, Duration::ZERO);
        assert_eq!(
            fs.start().await.unwrap(),
            1,
            "the readable record is replayed"
        );
        assert_eq!(fs.drain(false).await, 0);
    });
    assert_eq!(&store.object_bytes("b").unwrap()[..], b"acknowledged bytes");
    let aside: Vec<_> = std::fs::read_dir(cache.join("staging"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "orphan"))
        .collect();
    assert_eq!(aside.len(), 1, "the damaged record's data is kept aside");
}

/// A failed journal write (a full cache disk, where users delete files to make room) after
/// an `rm` or `mv` of a file not yet uploaded must not leave the mount and the journal
/// disagreeing: the name the mount shows now is the name the next mount shows. The change
/// fails whole (the file stays where it was, here and after a restart). Both ways a journal
/// write fails: the line is not taken (a full disk), or it is and its sync fails.
#[test]
fn a_failed_journal_write_never_brings_a_removed_name_back() {
    for fault in ["append", "sync"] {
        for op in ["rm", "mv", "mv-over"] {
            failed_journal_write(op, fault);
        }
    }
}

fn failed_journal_write(op: &str, fault: &str) {
    let case = format!("{op} ({fault} fails)");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("c");
    let store = Arc::new(MemoryStore::new());
    let data = bytes(5_000, 11);
    let other = bytes(3_000, 13);
    let shown_here: (bool, bool);
    {
        let rt = tokio::runtime::Runtime::new().unwrap();
        shown_here = rt.block_on(async {
            let fs = mount(&store, &cache, Duration::from_secs(3600));
            let (_, h) = fs.create(ROOT_INO, "f").await.unwrap();
            fs.write(h.fh, 0, &data).await.unwrap();
            fs.flush(h.fh).await.unwrap();
            fs.release(h.fh).await;
            if op == "mv-over" {
                let (_, h) = fs.create(ROOT_INO, "g").await.unwrap();
                fs.write(h.fh, 0, &other).await.unwrap();
                fs.flush(h.fh).await.unwrap();
                fs.release(h.fh).await;
            }
            let w = fs.write.as_ref().unwrap().clone();
            match fault {
                "append" => w.fail_journal_appends(10),
                _ => w.fail_journal_syncs(1),
            }
            let result = match op {
                "rm" => fs.unlink(ROOT_INO, "f").await,
                _ => fs.rename(ROOT_INO, "f", ROOT_INO, "g").await,
            };
            w.fail_journal_appends(0);
            w.fail_journal_syncs(0);
            assert!(result.is_err(), "{case}: the journal could not record it");
            let f = fs.lookup(ROOT_INO, "f").await.is_ok();
            let g = match fs.lookup(ROOT_INO, "g").await {
                Ok(a) => Some(read_all(&fs, a.ino).await),
                Err(_) => None,
            };
            if op == "mv-over" {
                assert_eq!(
                    g.as_deref(),
                    Some(&other[..]),
                    "{case}: g is still the old g"
                );
            }
            // Killed here: what the journal holds is what the next mount has.
            drop(fs);
            (f, g.is_some())
        });
        rt.shutdown_timeout(Duration::from_secs(5));
    }
    assert!(
        shown_here.0,
        "{case}: a failed change leaves f where it was"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fs = mount(&store, &cache, Duration::ZERO);
        fs.start().await.unwrap();
        assert_eq!(fs.drain(false).await, 0, "{case}");
    });
    let f = store.object_bytes("f").map(|b| b.to_vec());
    let g = store.object_bytes("g").map(|b| b.to_vec());
    assert_eq!(
        f.as_deref(),
        Some(&data[..]),
        "{case}: f is uploaded under its name"
    );
    match op {
        "mv-over" => assert_eq!(g.as_deref(), Some(&other[..]), "{case}: g keeps its bytes"),
        _ => assert_eq!(g, None, "{case}: nothing lands under g"),
    }
    assert_eq!(shown_here.1, op == "mv-over", "{case}");
}

/// The same for a file already in the bucket and changed since: its object is deleted, then
/// the journal cannot record the removal. The `rm` fails, the changed file stays, and its
/// upload lands under its own name, not as a conflict with its own delete.
#[tokio::test]
async fn a_failed_journal_write_after_a_delete_keeps_the_changed_file_under_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, &dir.path().join("c"), Duration::from_secs(3600));
    let first = bytes(4_000, 3);
    let changed = bytes(6_000, 5);
    let (attr, h) = fs.create(ROOT_INO, "f").await.unwrap();
    fs.write(h.fh, 0, &first).await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(store.object_bytes("f").unwrap(), first);
    let h = fs.open(attr.ino, WT).await.unwrap();
    fs.write(h.fh, 0, &changed).await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    let w = fs.write.as_ref().unwrap().clone();
    w.fail_journal_appends(10);
    let result = fs.unlink(ROOT_INO, "f").await;
    w.fail_journal_appends(0);
    assert!(result.is_err(), "the journal could not record the removal");
    let a = fs.lookup(ROOT_INO, "f").await.expect("f stays");
    assert_eq!(read_all(&fs, a.ino).await, changed);
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(
        store.object_bytes("f").unwrap(),
        changed,
        "uploaded under its name"
    );
    assert!(
        temp_parts(&store).is_empty(),
        "no conflict copy: {:?}",
        temp_parts(&store)
    );
}

/// A rename of a file never looked up here over a file still open (simulation seed 1481):
/// the name must get an inode of its own, not keep the replaced file's, which the open handle
/// still holds; else the kernel (its page cache, a passthrough handle's backing file) would
/// show the replaced file's bytes under the name, after a later rename too.
#[tokio::test(start_paused = true)]
async fn a_rename_over_an_open_file_gives_the_name_another_inode() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("a", b"AAA".to_vec());
    let fs = mount(&store, &dir.path().join("c"), Duration::from_millis(5));
    let (attr, h) = fs.create(ROOT_INO, "x").await.unwrap();
    fs.write(h.fh, 0, b"the replaced file").await.unwrap();
    fs.rename(ROOT_INO, "a", ROOT_INO, "x").await.unwrap();
    let x = fs.lookup(ROOT_INO, "x").await.unwrap();
    assert_ne!(
        x.ino, attr.ino,
        "the name answers with the replaced file's inode"
    );
    assert_eq!(x.size, 3);
    fs.rename(ROOT_INO, "x", ROOT_INO, "y").await.unwrap();
    let y = fs.lookup(ROOT_INO, "y").await.unwrap();
    assert_ne!(y.ino, attr.ino);
    assert_eq!(read_all(&fs, y.ino).await, b"AAA");
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("y").unwrap()[..], b"AAA");
}
