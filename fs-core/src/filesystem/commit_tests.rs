//! The commit contract (`write/commit.rs`): a close is durable against a crash of the daemon at
//! once and against a power cut within `--commit-interval`; a version a power cut damaged gives
//! way to the version before it, never to a mix and never to nothing. Bytes are checked in the
//! bucket.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::namespace::ROOT_INO;
use crate::store::memory::MemoryStore;

use super::tests::{read_all, W, WT};

fn wcfg(cache: &std::path::Path, delay: Duration, sync_on_close: bool) -> WriteConfig {
    let mut w = WriteConfig::new(cache.to_path_buf());
    w.write_back_delay = delay;
    w.commit_interval = Duration::from_secs(1);
    w.sync_on_close = sync_on_close;
    w
}

fn mount(store: &Arc<MemoryStore>, w: WriteConfig) -> Filesystem<MemoryStore> {
    Filesystem::with_write(store.clone(), MountConfig::new("bkt"), w).unwrap()
}

async fn write_file(fs: &Filesystem<MemoryStore>, name: &str, data: &[u8]) {
    let ino = match fs.lookup(ROOT_INO, name).await {
        Ok(a) => a.ino,
        Err(_) => fs.create(ROOT_INO, name).await.unwrap().0.ino,
    };
    let h = fs.open(ino, WT).await.unwrap();
    fs.write(h.fh, 0, data).await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
}

fn exposed(fs: &Filesystem<MemoryStore>) -> usize {
    fs.power_cut_exposure().unwrap().files.len()
}

#[tokio::test(start_paused = true)]
async fn a_close_is_durable_within_one_commit_interval_and_at_once_with_sync_on_close() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(
        &store,
        wcfg(&dir.path().join("c"), Duration::from_secs(3600), false),
    );
    write_file(&fs, "a", b"first").await;
    write_file(&fs, "b", b"second").await;
    assert_eq!(exposed(&fs), 2, "closed, not yet committed");
    let (log, synced) = fs.power_cut_exposure().unwrap().journal;
    assert!(
        synced < std::fs::metadata(&log).unwrap().len(),
        "lines not yet synced"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(exposed(&fs), 0, "committed one interval later");
    let (log, synced) = fs.power_cut_exposure().unwrap().journal;
    assert_eq!(synced, std::fs::metadata(&log).unwrap().len());
    drop(fs);

    let dir = tempfile::tempdir().unwrap();
    let fs = mount(
        &store,
        wcfg(&dir.path().join("c"), Duration::from_secs(3600), true),
    );
    write_file(&fs, "c", b"third").await;
    assert_eq!(
        exposed(&fs),
        0,
        "--sync-on-close: durable when close returns"
    );
}

/// A power cut after a newer version's close and before its commit, its bytes lost: the
/// replay falls back to the version before it (kept, record and file, for this), in another
/// staging file or, for an append, as the first bytes of the same one.
#[test]
fn a_version_a_power_cut_damaged_gives_way_to_the_one_before() {
    for (append, twice) in [(false, false), (true, false), (true, true)] {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("c");
        let store = Arc::new(MemoryStore::new());
        let old = vec![7u8; 50_000];
        let exposure = {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            let exposure = rt.block_on(async {
                let fs = mount(&store, wcfg(&cache, Duration::from_secs(3600), false));
                write_file(&fs, "f", &old).await;
                tokio::time::sleep(Duration::from_millis(1100)).await;
                assert_eq!(exposed(&fs), 0);
                let ino = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
                let (mode, at) = if append {
                    (W, old.len() as u64)
                } else {
                    (WT, 0)
                };
                let h = fs.open(ino, mode).await.unwrap();
                fs.write(h.fh, at, &[9u8; 30_000]).await.unwrap();
                fs.flush(h.fh).await.unwrap();
                fs.release(h.fh).await;
                if twice {
                    // A second append within the interval: its fallback is still the last
                    // durable version, not the first append (not durable either).
                    let h = fs.open(ino, W).await.unwrap();
                    fs.write(h.fh, at + 30_000, &[5u8; 1000]).await.unwrap();
                    fs.flush(h.fh).await.unwrap();
                    fs.release(h.fh).await;
                }
                let exposure = fs.power_cut_exposure().unwrap();
                drop(fs);
                exposure
            });
            rt.shutdown_timeout(Duration::from_secs(5));
            exposure
        };
        // The power cut: the new version's bytes never reached the disk (its journal line did).
        assert_eq!(exposure.files.len(), 1 + twice as usize, "append {append}");
        let (path, from) = &exposure.files[0];
        assert_eq!(*from, if append { old.len() as u64 } else { 0 });
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.set_len(*from + 10).unwrap();
        drop(f);
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let fs = mount(&store, wcfg(&cache, Duration::ZERO, false));
            assert_eq!(fs.start().await.unwrap(), 1, "append {append}");
            let ino = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
            assert_eq!(
                read_all(&fs, ino).await,
                old,
                "append {append}: the mount shows it"
            );
            assert_eq!(fs.drain(false).await, 0);
        });
        assert_eq!(store.object_bytes("f").unwrap(), old, "append {append}");
    }
}

/// A commit whose `fdatasync` of a file the daemon wrote fails (the disk could not write it
/// back): with `--sync-on-close` the close fails with EIO; the version is uploaded only as its
/// bytes arrived (its CRC32C is checked against what the upload reads), and a second commit
/// does not take the failure back. Without `--sync-on-close` the close had already returned.
#[tokio::test(start_paused = true)]
async fn a_sync_the_disk_failed_fails_a_close_that_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, wcfg(&dir.path().join("c"), Duration::ZERO, true));
    let wb = fs.write.as_ref().unwrap().clone();
    let (attr, h) = fs.create(ROOT_INO, "f").await.unwrap();
    fs.release(h.fh).await;
    let h = fs.open(attr.ino, WT).await.unwrap();
    fs.write(h.fh, 0, b"written").await.unwrap();
    wb.fail_data_syncs(1);
    let closed = fs.flush(h.fh).await;
    assert!(matches!(closed, Err(FsError::Io(_))), "{closed:?}");
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"written");
}

/// A file written through the daemon whose write-back the disk failed, and whose bytes then
/// read as the disk holds them (the page cache let go of them): its upload finds them changed
/// since they arrived, and it is kept staged, not saved, instead of being tried again forever;
/// the bucket keeps its last whole version.
#[tokio::test(start_paused = true)]
async fn a_daemon_written_file_the_disk_lost_is_kept_not_saved() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("f", b"the good object".to_vec());
    let fs = mount(
        &store,
        wcfg(&dir.path().join("c"), Duration::from_secs(10), false),
    );
    let wb = fs.write.as_ref().unwrap().clone();
    wb.fail_data_syncs(1);
    write_file(&fs, "f", b"bytes written").await;
    let staged = fs.power_cut_exposure().unwrap().files[0].0.clone();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(exposed(&fs), 0, "the commit went on");
    std::fs::write(&staged, [0u8; 13]).unwrap();
    assert_eq!(fs.drain(true).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"the good object");
    assert_eq!(wb.status().await.held_files, 1);
    write_file(&fs, "f", b"written again").await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"written again");
}
