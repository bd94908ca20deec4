//! The write path through the facade, against `MemoryStore`.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::namespace::ROOT_INO;
use crate::store::memory::MemoryStore;
use crate::write::upload::UploadConfig;

fn wcfg(dir: &std::path::Path, delay_ms: u64) -> WriteConfig {
    let mut w = WriteConfig::new(dir.join("cache"));
    w.write_back_delay = Duration::from_millis(delay_ms);
    w.retry_initial = Duration::from_millis(10);
    w.upload = UploadConfig {
        single_shot_threshold: 64 * 1024,
        part_size: 16 * 1024,
        ..UploadConfig::default()
    };
    w
}

fn writable(store: &Arc<MemoryStore>, dir: &std::path::Path) -> Filesystem<MemoryStore> {
    Filesystem::with_write(store.clone(), MountConfig::new("bkt"), wcfg(dir, 0)).unwrap()
}

const W: OpenMode = OpenMode {
    write: true,
    truncate: false,
};
const WT: OpenMode = OpenMode {
    write: true,
    truncate: true,
};

async fn write_file(fs: &Filesystem<MemoryStore>, parent: Ino, name: &str, data: &[u8]) -> Ino {
    let (attr, h) = fs.create(parent, name).await.unwrap();
    fs.write(h.fh, 0, data).await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    attr.ino
}

async fn read_all(fs: &Filesystem<MemoryStore>, ino: Ino) -> Vec<u8> {
    let h = fs.open(ino, OpenMode::default()).await.unwrap();
    let mut out = Vec::new();
    loop {
        let b = fs.read(h.fh, out.len() as u64, 100_000).await.unwrap();
        if b.is_empty() {
            break;
        }
        out.extend_from_slice(&b);
    }
    fs.release(h.fh).await;
    out
}

#[tokio::test]
async fn create_write_close_uploads_with_mtime() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = writable(&store, dir.path());
    for (name, size) in [
        ("empty", 0usize),
        ("one", 1),
        ("small", 1000),
        ("big", 200_000),
    ] {
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let ino = write_file(&fs, ROOT_INO, name, &data).await;
        // Readers see the file before it is uploaded.
        assert_eq!(fs.getattr(ino).await.unwrap().size, size as u64);
        assert_eq!(read_all(&fs, ino).await, data);
        assert_eq!(fs.drain(false).await, 0);
        assert_eq!(store.object_bytes(name).unwrap(), data, "{name}");
        let meta = store.head(name).await.unwrap();
        assert!(meta.metadata.contains_key(crate::store::MTIME_KEY));
    }
    let s = fs.write_status().await;
    assert_eq!((s.pending_files, s.uploaded_files), (0, 4));
    assert!(
        store.keys().iter().all(|k| !k.starts_with(TEMP_DIR)),
        "temporaries cleaned: {:?}",
        store.keys()
    );
}

#[tokio::test]
async fn overwrite_truncate_append_and_random_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("f", vec![b'a'; 100_000]);
    let fs = writable(&store, dir.path());
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    // A pwrite in the middle: the rest of the bytes come from the bucket.
    let h = fs.open(f.ino, W).await.unwrap();
    fs.write(h.fh, 50_000, b"MIDDLE").await.unwrap();
    // Append at the end.
    fs.write(h.fh, 100_000, b"TAIL").await.unwrap();
    fs.fsync(h.fh).await.unwrap();
    fs.release(h.fh).await;
    let mut want = vec![b'a'; 100_000];
    want[50_000..50_006].copy_from_slice(b"MIDDLE");
    want.extend_from_slice(b"TAIL");
    assert_eq!(
        store.object_bytes("f").unwrap(),
        want,
        "fsync returns with the data in the bucket"
    );
    // Shrink, then grow.
    fs.setattr(f.ino, Some(10), None, None).await.unwrap();
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(store.object_bytes("f").unwrap(), vec![b'a'; 10]);
    fs.setattr(f.ino, Some(20), None, None).await.unwrap();
    assert_eq!(fs.drain(false).await, 0);
    let mut grown = vec![b'a'; 10];
    grown.extend_from_slice(&[0u8; 10]);
    assert_eq!(store.object_bytes("f").unwrap(), grown);
    // O_TRUNC and rewrite.
    let h = fs.open(f.ino, WT).await.unwrap();
    fs.write(h.fh, 0, b"new").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"new");
}

#[tokio::test]
async fn namespace_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = writable(&store, dir.path());
    let d = fs.mkdir(ROOT_INO, "d").await.unwrap();
    assert!(store.object_bytes("d/").is_some(), "mkdir makes a marker");
    assert_eq!(fs.mkdir(ROOT_INO, "d").await.unwrap_err(), FsError::Exists);
    let f = write_file(&fs, d.ino, "f.txt", b"hello").await;
    assert_eq!(
        fs.rmdir(ROOT_INO, "d").await.unwrap_err(),
        FsError::NotEmpty,
        "not empty while staged"
    );
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(
        fs.rmdir(ROOT_INO, "d").await.unwrap_err(),
        FsError::NotEmpty
    );
    // Rename a file in the bucket.
    fs.rename(d.ino, "f.txt", ROOT_INO, "g.txt").await.unwrap();
    assert!(store.object_bytes("d/f.txt").is_none());
    assert_eq!(&store.object_bytes("g.txt").unwrap()[..], b"hello");
    assert_eq!(
        fs.getattr(f).await.unwrap().size,
        5,
        "the inode follows the rename"
    );
    // Rename a staged file: the pending upload follows the new name.
    let mut wc = wcfg(dir.path(), 60_000);
    wc.cache_dir = dir.path().join("cache2");
    let fs2 = Filesystem::with_write(store.clone(), MountConfig::new("bkt"), wc).unwrap();
    write_file(&fs2, ROOT_INO, "pending", b"p").await;
    fs2.rename(ROOT_INO, "pending", ROOT_INO, "renamed")
        .await
        .unwrap();
    assert_eq!(fs2.drain(false).await, 0);
    assert!(store.object_bytes("pending").is_none());
    assert_eq!(&store.object_bytes("renamed").unwrap()[..], b"p");
    // Rename over an existing file replaces it.
    write_file(&fs, ROOT_INO, "a", b"A").await;
    write_file(&fs, ROOT_INO, "b", b"B").await;
    assert_eq!(fs.drain(false).await, 0);
    fs.rename(ROOT_INO, "a", ROOT_INO, "b").await.unwrap();
    assert_eq!(&store.object_bytes("b").unwrap()[..], b"A");
    assert!(store.object_bytes("a").is_none());
    // Directory rename moves every object.
    let x = fs.mkdir(ROOT_INO, "x").await.unwrap();
    write_file(&fs, x.ino, "1", b"1").await;
    let y = fs.mkdir(x.ino, "y").await.unwrap();
    write_file(&fs, y.ino, "2", b"2").await;
    assert_eq!(fs.drain(false).await, 0);
    fs.rename(ROOT_INO, "x", ROOT_INO, "z").await.unwrap();
    let mut keys = store.keys();
    keys.retain(|k| k.starts_with('x') || k.starts_with('z'));
    assert_eq!(keys, vec!["z/", "z/1", "z/y/", "z/y/2"]);
    // Unlink, rmdir.
    let z = fs.lookup(ROOT_INO, "z").await.unwrap();
    let zy = fs.lookup(z.ino, "y").await.unwrap();
    fs.unlink(zy.ino, "2").await.unwrap();
    fs.rmdir(z.ino, "y").await.unwrap();
    assert!(store.keys().iter().all(|k| !k.starts_with("z/y")));
    assert_eq!(
        fs.unlink(ROOT_INO, "nothing").await.unwrap_err(),
        FsError::NotFound
    );
}

#[tokio::test]
async fn directory_rename_over_the_limit_is_exdev() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    for i in 0..5 {
        store.insert(&format!("big/{i}"), "x");
    }
    let mut cfg = MountConfig::new("bkt");
    cfg.rename_dir_limit = 4;
    let fs = Filesystem::with_write(store.clone(), cfg, wcfg(dir.path(), 0)).unwrap();
    fs.lookup(ROOT_INO, "big").await.unwrap();
    assert_eq!(
        fs.rename(ROOT_INO, "big", ROOT_INO, "moved")
            .await
            .unwrap_err()
            .errno(),
        libc::EXDEV
    );
    assert_eq!(store.keys().len(), 5, "nothing was copied or deleted");
}

#[tokio::test]
async fn a_file_changed_behind_an_open_handle_ends_as_two_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("doc", "v1");
    let fs = writable(&store, dir.path());
    let doc = fs.lookup(ROOT_INO, "doc").await.unwrap();
    let h = fs.open(doc.ino, WT).await.unwrap();
    fs.write(h.fh, 0, b"ours").await.unwrap();
    store.insert("doc", "theirs");
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(
        &store.object_bytes("doc").unwrap()[..],
        b"theirs",
        "the bucket's newer version is kept"
    );
    let copies: Vec<String> = store
        .keys()
        .into_iter()
        .filter(|k| k.starts_with("doc.conflict-"))
        .collect();
    assert_eq!(copies.len(), 1, "{:?}", store.keys());
    assert_eq!(&store.object_bytes(&copies[0]).unwrap()[..], b"ours");
    assert_eq!(fs.write_status().await.conflicts, 1);
}

#[tokio::test]
async fn readdir_shows_files_not_yet_uploaded() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("old", "x");
    let mut wc = wcfg(dir.path(), 60_000);
    wc.cache_dir = dir.path().join("c");
    let fs = Filesystem::with_write(store.clone(), MountConfig::new("bkt"), wc).unwrap();
    write_file(&fs, ROOT_INO, "new", b"12345").await;
    let fh = fs.opendir(ROOT_INO).await.unwrap();
    let mut entries = Vec::new();
    let mut offset = 0;
    loop {
        let batch = fs.readdir(fh, offset).await.unwrap();
        let Some(last) = batch.last() else { break };
        offset = last.offset;
        entries.extend(batch);
    }
    let mut names: Vec<(String, u64)> = entries
        .iter()
        .filter(|e| !e.name.starts_with('.'))
        .map(|e| (e.name.clone(), e.attr.size))
        .collect();
    names.sort();
    assert_eq!(names, vec![("new".to_string(), 5), ("old".to_string(), 1)]);
    assert!(
        store.object_bytes("new").is_none(),
        "still waiting for its write-back delay"
    );
}

#[tokio::test]
async fn a_file_rewritten_before_its_upload_starts_is_uploaded_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let mut wc = wcfg(dir.path(), 300);
    wc.cache_dir = dir.path().join("c");
    let fs = Filesystem::with_write(store.clone(), MountConfig::new("bkt"), wc).unwrap();
    let ino = write_file(&fs, ROOT_INO, "f", b"one").await;
    for round in 0..5u8 {
        let h = fs.open(ino, WT).await.unwrap();
        fs.write(h.fh, 0, &[round; 10]).await.unwrap();
        fs.flush(h.fh).await.unwrap();
        fs.release(h.fh).await;
    }
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(store.object_bytes("f").unwrap(), vec![4u8; 10]);
    assert_eq!(
        store.counts.write.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

/// A crash (the runtime dies with uploads pending) loses nothing: the next mount replays the
/// journal and uploads every file that was closed.
#[test]
fn journal_replay_uploads_what_a_crash_left_behind() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let files: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| (format!("f{i}"), vec![i as u8; 1000 + i * 5000]))
        .collect();
    {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let mut wc = wcfg(dir.path(), 3_600_000);
            wc.cache_dir = dir.path().join("c");
            let fs = Filesystem::with_write(store.clone(), MountConfig::new("bkt"), wc).unwrap();
            for (name, data) in &files {
                write_file(&fs, ROOT_INO, name, data).await;
            }
            // A part-way composite upload, as if the crash hit mid-upload.
            store.insert(&format!("{TEMP_DIR}/0000000000000099-1/00000"), "orphan");
        });
        rt.shutdown_timeout(Duration::from_secs(5)); // the crash: pending upload tasks vanish
    }
    assert_eq!(
        store.keys().len(),
        1,
        "nothing was uploaded before the crash"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut wc = wcfg(dir.path(), 0);
        wc.cache_dir = dir.path().join("c");
        let fs = Filesystem::with_write(store.clone(), MountConfig::new("bkt"), wc).unwrap();
        assert_eq!(fs.start().await.unwrap(), files.len());
        assert_eq!(fs.drain(false).await, 0);
    });
    for (name, data) in &files {
        assert_eq!(
            store.object_bytes(name).as_deref(),
            Some(&data[..]),
            "{name}"
        );
    }
    assert!(
        store.keys().iter().all(|k| !k.starts_with(TEMP_DIR)),
        "orphaned parts removed"
    );
    let journal = std::fs::read_dir(dir.path().join("c/journal"))
        .unwrap()
        .count();
    assert_eq!(
        journal, 0,
        "every record is gone once its file is in the bucket"
    );
}

#[tokio::test]
async fn failed_uploads_stay_staged_and_are_retried() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = Filesystem::with_write(
        store.clone(),
        MountConfig::new("bkt"),
        wcfg(dir.path(), 60_000),
    )
    .unwrap();
    write_file(&fs, ROOT_INO, "f", b"data").await;
    // The next three upload attempts fail; the file stays staged and goes up on a retry.
    store.fail_next(3);
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"data");
    assert!(fs.write_status().await.failures >= 1);
}
