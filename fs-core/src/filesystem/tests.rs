//! The write path through the facade, against `MemoryStore`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;
use crate::namespace::ROOT_INO;
use crate::store::memory::MemoryStore;
use crate::store::{ObjectStore, Posix, Precondition, MTIME_KEY, MTIME_PRECISE_KEY, SYMLINK_KEY};
use crate::write::upload::UploadConfig;
use bytes::Bytes;

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

pub(super) const W: OpenMode = OpenMode {
    write: true,
    truncate: false,
    process: None,
};
pub(super) const WT: OpenMode = OpenMode {
    write: true,
    truncate: true,
    process: None,
};

async fn write_file(fs: &Filesystem<MemoryStore>, parent: Ino, name: &str, data: &[u8]) -> Ino {
    let (attr, h) = fs.create(parent, name).await.unwrap();
    fs.write(h.fh, 0, data).await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    attr.ino
}

/// Every entry of open directory `fh`, read as the kernel reads: until an empty answer.
async fn readdir_all(fs: &Filesystem<MemoryStore>, fh: u64) -> Vec<DirEntry> {
    let mut entries = Vec::new();
    let mut offset = 0;
    loop {
        let batch = fs.readdir(fh, offset).await.unwrap();
        let Some(last) = batch.last() else {
            return entries;
        };
        offset = last.offset;
        entries.extend(batch);
    }
}

pub(super) async fn read_all(fs: &Filesystem<MemoryStore>, ino: Ino) -> Vec<u8> {
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
            .unwrap_err(),
        FsError::CrossDevice
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
    let fh = fs.opendir(ROOT_INO).await.unwrap().fh;
    let entries = readdir_all(&fs, fh).await;
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
/// Live records in the journal at `dir`.
fn fs_core_journal(dir: &std::path::Path) -> usize {
    crate::write::journal::read_records(dir).unwrap().len()
}

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
            // A part-way composite upload of ours, as if the crash hit mid-upload, and one of
            // another mount of the same bucket, in flight right now.
            let tag = std::fs::read_to_string(dir.path().join("c/mount-id")).unwrap();
            store.insert(
                &format!("{TEMP_DIR}/{tag}/0000000000000001-1/00000"),
                "orphan",
            );
            store.insert(
                &format!("{TEMP_DIR}/0123456789abcdef/0000000000000001-1/00000"),
                "theirs",
            );
        });
        rt.shutdown_timeout(Duration::from_secs(5)); // the crash: pending upload tasks vanish
    }
    assert_eq!(
        store.keys().len(),
        2,
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
    assert_eq!(
        store
            .keys()
            .into_iter()
            .filter(|k| k.starts_with(TEMP_DIR))
            .collect::<Vec<_>>(),
        vec![format!(
            "{TEMP_DIR}/0123456789abcdef/0000000000000001-1/00000"
        )],
        "our orphaned part removed, another mount's fresh part kept"
    );
    let journal = fs_core_journal(&dir.path().join("c/journal"));
    assert_eq!(
        journal, 0,
        "every record is gone once its file is in the bucket"
    );
}

/// A time set to the nanosecond on a file that a crash left staged is uploaded as it was set.
#[test]
fn journal_replay_keeps_the_nanoseconds_of_the_mtime() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let t = SystemTime::UNIX_EPOCH + Duration::new(1_577_941_567, 123_456_700);
    let mount = |delay_ms| {
        let mut wc = wcfg(dir.path(), delay_ms);
        wc.cache_dir = dir.path().join("c");
        Filesystem::with_write(store.clone(), MountConfig::new("bkt"), wc).unwrap()
    };
    {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let fs = mount(3_600_000);
            let (attr, h) = fs.create(ROOT_INO, "f").await.unwrap();
            fs.write(h.fh, 0, b"data").await.unwrap();
            fs.setattr(attr.ino, None, Some(t), Some(h.fh))
                .await
                .unwrap();
            fs.flush(h.fh).await.unwrap();
            fs.release(h.fh).await;
        });
        rt.shutdown_timeout(Duration::from_secs(5)); // the crash
    }
    assert!(store.object_bytes("f").is_none(), "not uploaded before");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fs = mount(0);
        assert_eq!(fs.start().await.unwrap(), 1);
        let f = fs.lookup(ROOT_INO, "f").await.unwrap();
        assert_eq!(f.mtime, t, "shown as set while it waits");
        assert_eq!(fs.drain(false).await, 0);
        let meta = store.head("f").await.unwrap();
        assert_eq!(meta.metadata[MTIME_KEY], "1577941567");
        assert_eq!(
            meta.metadata[MTIME_PRECISE_KEY],
            "2020-01-02T05:06:07.123456700Z"
        );
    });
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

mod model {
    //! The reference-model test: random operations applied to the filesystem core and to a
    //! plain map of paths; once uploads drain, the bucket must hold exactly the model.

    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    const FILES: [&str; 6] = ["a", "b", "d1/a", "d1/b", "d2/a", "d2/c"];
    const DIRS: [&str; 2] = ["d1", "d2"];

    #[derive(Debug, Clone)]
    enum Op {
        Write {
            file: usize,
            offset: u16,
            len: u16,
            byte: u8,
        },
        Append {
            file: usize,
            len: u16,
            byte: u8,
        },
        Truncate {
            file: usize,
            len: u16,
        },
        Rename {
            from: usize,
            to: usize,
        },
        Unlink {
            file: usize,
        },
        Mkdir {
            dir: usize,
        },
        Rmdir {
            dir: usize,
        },
        Fsync {
            file: usize,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        let f = 0..FILES.len();
        let d = 0..DIRS.len();
        prop_oneof![
            4 => (f.clone(), 0u16..3000, 1u16..3000, any::<u8>()).prop_map(|(file, offset, len, byte)| Op::Write { file, offset, len, byte }),
            2 => (f.clone(), 1u16..2000, any::<u8>()).prop_map(|(file, len, byte)| Op::Append { file, len, byte }),
            1 => (f.clone(), 0u16..4000).prop_map(|(file, len)| Op::Truncate { file, len }),
            2 => (f.clone(), f.clone()).prop_map(|(from, to)| Op::Rename { from, to }),
            1 => f.clone().prop_map(|file| Op::Unlink { file }),
            2 => d.clone().prop_map(|dir| Op::Mkdir { dir }),
            1 => d.prop_map(|dir| Op::Rmdir { dir }),
            1 => f.prop_map(|file| Op::Fsync { file }),
        ]
    }

    #[derive(Default, Debug)]
    struct Model {
        files: BTreeMap<String, Vec<u8>>,
        dirs: Vec<String>,
    }

    impl Model {
        fn parent_exists(&self, path: &str) -> bool {
            match path.rsplit_once('/') {
                None => true,
                Some((d, _)) => self.dirs.iter().any(|x| x == d),
            }
        }
        fn dir_empty(&self, d: &str) -> bool {
            !self.files.keys().any(|k| k.starts_with(&format!("{d}/")))
        }
    }

    async fn ino_of(fs: &Filesystem<MemoryStore>, path: &str) -> FsResult<Ino> {
        let mut ino = ROOT_INO;
        for part in path.split('/') {
            ino = fs.lookup(ino, part).await?.ino;
        }
        Ok(ino)
    }

    async fn parent_and_name<'a>(fs: &Filesystem<MemoryStore>, path: &'a str) -> (Ino, &'a str) {
        match path.rsplit_once('/') {
            None => (ROOT_INO, path),
            Some((d, n)) => (ino_of(fs, d).await.unwrap(), n),
        }
    }

    async fn pwrite(
        fs: &Filesystem<MemoryStore>,
        path: &str,
        exists: bool,
        offset: u64,
        data: &[u8],
    ) {
        let fh = if exists {
            let ino = ino_of(fs, path).await.unwrap();
            fs.open(ino, W).await.unwrap().fh
        } else {
            let (parent, name) = parent_and_name(fs, path).await;
            fs.create(parent, name).await.unwrap().1.fh
        };
        fs.write(fh, offset, data).await.unwrap();
        fs.flush(fh).await.unwrap();
        fs.release(fh).await;
    }

    async fn apply(fs: &Filesystem<MemoryStore>, m: &mut Model, op: &Op) {
        match *op {
            Op::Write {
                file,
                offset,
                len,
                byte,
            } => {
                let path = FILES[file];
                if !m.parent_exists(path) {
                    return;
                }
                let exists = m.files.contains_key(path);
                let data = vec![byte; len as usize];
                pwrite(fs, path, exists, u64::from(offset), &data).await;
                let f = m.files.entry(path.to_string()).or_default();
                let end = offset as usize + data.len();
                if f.len() < end {
                    f.resize(end, 0);
                }
                f[offset as usize..end].copy_from_slice(&data);
            }
            Op::Append { file, len, byte } => {
                let path = FILES[file];
                let Some(cur) = m.files.get(path).map(Vec::len) else {
                    return;
                };
                let data = vec![byte; len as usize];
                pwrite(fs, path, true, cur as u64, &data).await;
                m.files.get_mut(path).unwrap().extend_from_slice(&data);
            }
            Op::Truncate { file, len } => {
                let path = FILES[file];
                if !m.files.contains_key(path) {
                    return;
                }
                let ino = ino_of(fs, path).await.unwrap();
                fs.setattr(ino, Some(u64::from(len)), None, None)
                    .await
                    .unwrap();
                m.files.get_mut(path).unwrap().resize(len as usize, 0);
            }
            Op::Rename { from, to } => {
                let (src, dst) = (FILES[from], FILES[to]);
                if src == dst || !m.files.contains_key(src) || !m.parent_exists(dst) {
                    return;
                }
                let (p1, n1) = parent_and_name(fs, src).await;
                let (p2, n2) = parent_and_name(fs, dst).await;
                fs.rename(p1, n1, p2, n2).await.unwrap();
                let data = m.files.remove(src).unwrap();
                m.files.insert(dst.to_string(), data);
            }
            Op::Unlink { file } => {
                let path = FILES[file];
                let (parent, name) = match path.rsplit_once('/') {
                    Some((d, _)) if !m.dirs.iter().any(|x| x == d) => return,
                    _ => parent_and_name(fs, path).await,
                };
                let r = fs.unlink(parent, name).await;
                if m.files.remove(path).is_some() {
                    r.unwrap();
                } else {
                    assert_eq!(r.unwrap_err(), FsError::NotFound);
                }
            }
            Op::Mkdir { dir } => {
                let d = DIRS[dir];
                let r = fs.mkdir(ROOT_INO, d).await;
                if m.dirs.iter().any(|x| x == d) {
                    assert_eq!(r.unwrap_err(), FsError::Exists);
                } else {
                    r.unwrap();
                    m.dirs.push(d.to_string());
                }
            }
            Op::Rmdir { dir } => {
                let d = DIRS[dir];
                if !m.dirs.iter().any(|x| x == d) {
                    return;
                }
                let r = fs.rmdir(ROOT_INO, d).await;
                if m.dir_empty(d) {
                    r.unwrap();
                    m.dirs.retain(|x| x != d);
                } else {
                    assert_eq!(r.unwrap_err(), FsError::NotEmpty);
                }
            }
            Op::Fsync { file } => {
                let path = FILES[file];
                if !m.files.contains_key(path) {
                    return;
                }
                let ino = ino_of(fs, path).await.unwrap();
                let fh = fs.open(ino, W).await.unwrap().fh;
                fs.fsync(fh).await.unwrap();
                fs.release(fh).await;
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

        #[test]
        fn bucket_matches_the_model(ops in proptest::collection::vec(op(), 1..40), delay_ms in prop_oneof![Just(0u64), Just(5), Just(1000)]) {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let store = Arc::new(MemoryStore::new());
                let mut cfg = MountConfig::new("bkt");
                cfg.stat_ttl = Duration::from_secs(3600);
                let fs = Filesystem::with_write(store.clone(), cfg, wcfg(dir.path(), delay_ms)).unwrap();
                                let mut m = Model::default();
                let run = async {
                    for op in &ops {
                        apply(&fs, &mut m, op).await;
                    }
                    fs.drain(false).await
                };
                let left = tokio::time::timeout(Duration::from_secs(20), run).await;
                prop_assert_eq!(left, Ok(0), "operations or the drain hung");
                let mut want: BTreeMap<String, Vec<u8>> = m.files.clone();
                for d in &m.dirs {
                    want.insert(format!("{d}/"), Vec::new());
                }
                let got: BTreeMap<String, Vec<u8>> =
                    store.keys().into_iter().map(|k| { let v = store.object_bytes(&k).unwrap().to_vec(); (k, v) }).collect();
                prop_assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
                                for (k, v) in &want {
                    let first_diff = got[k].iter().zip(v.iter()).position(|(a, b)| a != b);
                    prop_assert!(
                        got[k] == *v,
                        "content of {}: bucket {} bytes, model {} bytes, first difference at {:?}",
                        k, got[k].len(), v.len(), first_diff
                    );
                }
                Ok(())
            })?;
        }
    }
}

/// Copying many new files into a directory we made, or one we listed, asks the bucket nothing
/// per name; after the listing expires, one listing answers again for every name.
#[tokio::test]
async fn new_names_in_a_listed_directory_cost_no_requests() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("listed/old", "x");
    let mut cfg = MountConfig::new("bkt");
    // Long enough that the 50 creates below finish inside it on a loaded machine (the TTL runs
    // on the real clock); 300 ms was not, nor 2 s under Wine.
    cfg.negative_ttl = Duration::from_secs(10);
    let fs = Filesystem::with_write(store.clone(), cfg, wcfg(dir.path(), 0)).unwrap();
    let reads = || {
        let c = &store.counts;
        c.head.load(std::sync::atomic::Ordering::SeqCst)
            + c.list.load(std::sync::atomic::Ordering::SeqCst)
    };

    let made = fs.mkdir(ROOT_INO, "made").await.unwrap();
    let before = reads();
    for i in 0..50 {
        let name = format!("f{i}");
        assert_eq!(
            fs.lookup(made.ino, &name).await.unwrap_err(),
            FsError::NotFound
        );
        write_file(&fs, made.ino, &name, b"data").await;
    }
    assert_eq!(reads(), before, "no lookups went to the bucket");

    let listed = fs.lookup(ROOT_INO, "listed").await.unwrap();
    let fh = fs.opendir(listed.ino).await.unwrap().fh;
    readdir_all(&fs, fh).await;
    let before = reads();
    assert_eq!(
        fs.lookup(listed.ino, "missing").await.unwrap_err(),
        FsError::NotFound
    );
    assert_eq!(fs.lookup(listed.ino, "old").await.unwrap().size, 1);
    assert_eq!(
        reads(),
        before,
        "answered by the listing and the stat cache"
    );

    // Someone else adds a file; once the listing expires it is found by one new listing.
    store.insert("listed/theirs", "yy");
    tokio::time::sleep(Duration::from_millis(10_100)).await;
    assert_eq!(fs.lookup(listed.ino, "theirs").await.unwrap().size, 2);
    let before = reads();
    assert_eq!(
        fs.lookup(listed.ino, "other").await.unwrap_err(),
        FsError::NotFound
    );
    assert_eq!(reads(), before);

    // Every file written is in the bucket, and visible by name after the upload.
    fs.drain(false).await;
    for i in 0..50 {
        assert_eq!(
            store.object_bytes(&format!("made/f{i}")).unwrap(),
            &b"data"[..]
        );
        assert_eq!(fs.lookup(made.ino, &format!("f{i}")).await.unwrap().size, 4);
    }
}

/// With a cache size, a write that does not fit makes closed files upload at once (whatever
/// their write-back delay) and waits for their space; only data of open files that cannot fit
/// gets ENOSPC, and nothing already written is lost. The file whose write failed is never
/// uploaded in part (I10): its close fails too, and it stays staged, not saved.
#[tokio::test]
async fn a_full_cache_waits_for_uploads_and_refuses_only_open_data() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let mut wc = wcfg(dir.path(), 3_600_000);
    wc.cache_size = Some(100_000);
    let fs = Filesystem::with_write(store.clone(), MountConfig::new("bkt"), wc).unwrap();

    write_file(&fs, ROOT_INO, "a", &[1u8; 60_000]).await;
    assert!(
        store.object_bytes("a").is_none(),
        "an hour of write-back delay"
    );
    // Does not fit beside `a`: waits until `a` is in the bucket.
    write_file(&fs, ROOT_INO, "b", &[2u8; 60_000]).await;
    assert_eq!(store.object_bytes("a").unwrap(), &[1u8; 60_000][..]);

    let (_, h) = fs.create(ROOT_INO, "c").await.unwrap();
    fs.write(h.fh, 0, &[3u8; 50_000]).await.unwrap();
    assert_eq!(
        fs.write(h.fh, 50_000, &[3u8; 60_000]).await.unwrap_err(),
        FsError::NoSpace,
        "an open file alone over the limit"
    );
    assert_eq!(fs.flush(h.fh).await, Err(FsError::NoSpace));
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(store.object_bytes("b").unwrap(), &[2u8; 60_000][..]);
    assert!(
        store.object_bytes("c").is_none(),
        "nothing of c is uploaded"
    );
    assert_eq!(fs.write_status().await.held_files, 1);
}

#[tokio::test]
async fn symlinks_are_marked_objects_that_survive_rename() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("target.txt", "hello");
    let fs = writable(&store, dir.path());
    let l = fs.symlink(ROOT_INO, "link", "target.txt").await.unwrap();
    assert_eq!(l.kind, Kind::Symlink);
    assert_eq!(l.size, "target.txt".len() as u64);
    assert_eq!(fs.readlink(l.ino).await.unwrap(), "target.txt");
    assert_eq!(
        fs.symlink(ROOT_INO, "link", "x").await.unwrap_err(),
        FsError::Exists
    );
    let t = fs.lookup(ROOT_INO, "target.txt").await.unwrap();
    assert_eq!(fs.readlink(t.ino).await.unwrap_err(), FsError::NotSymlink);
    // In the bucket: an empty object whose metadata names the target.
    assert_eq!(store.object_bytes("link").unwrap().len(), 0);
    let meta = store.head("link").await.unwrap();
    assert_eq!(meta.metadata[SYMLINK_KEY], "target.txt");
    // Touching a link changes nothing; renaming keeps it a link.
    fs.setattr(l.ino, None, Some(SystemTime::UNIX_EPOCH), None)
        .await
        .unwrap();
    fs.rename(ROOT_INO, "link", ROOT_INO, "moved")
        .await
        .unwrap();
    let m = fs.lookup(ROOT_INO, "moved").await.unwrap();
    assert_eq!(m.kind, Kind::Symlink);
    assert_eq!(fs.readlink(m.ino).await.unwrap(), "target.txt");
    // A fresh mount sees it as a link too, from a listing.
    let fresh = writable(&store, &dir.path().join("2"));
    let fh = fresh.opendir(ROOT_INO).await.unwrap().fh;
    let kinds: Vec<(String, Kind)> = readdir_all(&fresh, fh)
        .await
        .into_iter()
        .filter(|e| !e.name.starts_with('.'))
        .map(|e| (e.name, e.attr.kind))
        .collect();
    assert!(
        kinds.contains(&("moved".to_string(), Kind::Symlink)),
        "{kinds:?}"
    );
    assert!(kinds.contains(&("target.txt".to_string(), Kind::File)));
    fs.unlink(ROOT_INO, "moved").await.unwrap();
    assert!(store.object_bytes("moved").is_none());
}

/// A time that differs from the file's only below the second is a change, kept to the
/// nanosecond: on a file as it is in the bucket (a metadata patch) and on one being written
/// (with its upload). rsync and robocopy compare such times on their next run.
#[tokio::test]
async fn setattr_keeps_times_that_differ_only_below_the_second() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let whole = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    let fine = whole + Duration::from_nanos(123_456_700);
    let seconds_only = crate::store::WriteOptions {
        metadata: [(MTIME_KEY.to_string(), "1600000000".to_string())].into(),
        ..Default::default()
    };
    store
        .put(
            "f",
            bytes::Bytes::from_static(b"body"),
            crate::store::Precondition::None,
            &seconds_only,
        )
        .await
        .unwrap();
    let fs = Filesystem::with_write(
        store.clone(),
        MountConfig::new("bkt"),
        wcfg(dir.path(), 3_600_000),
    )
    .unwrap();
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    assert_eq!(f.mtime, whole);
    let writes = || store.counts.write.load(std::sync::atomic::Ordering::SeqCst);
    let w0 = writes();
    let a = fs.setattr(f.ino, None, Some(fine), None).await.unwrap();
    assert_eq!(a.mtime, fine);
    assert_eq!(writes() - w0, 1, "one metadata patch");
    let meta = store.head("f").await.unwrap();
    assert_eq!(meta.metadata[MTIME_KEY], "1600000000");
    assert_eq!(
        meta.metadata[MTIME_PRECISE_KEY],
        "2020-09-13T12:26:40.123456700Z"
    );
    fs.setattr(f.ino, None, Some(fine), None).await.unwrap();
    assert_eq!(writes() - w0, 1, "the time it has, exactly: nothing to do");
    let fresh = writable(&store, &dir.path().join("2"));
    assert_eq!(fresh.lookup(ROOT_INO, "f").await.unwrap().mtime, fine);

    // Being written: the later time, a few nanoseconds on, is the one uploaded.
    let (attr, h) = fs.create(ROOT_INO, "new").await.unwrap();
    fs.write(h.fh, 0, b"data").await.unwrap();
    fs.setattr(attr.ino, None, Some(whole), Some(h.fh))
        .await
        .unwrap();
    let a = fs
        .setattr(attr.ino, None, Some(fine), Some(h.fh))
        .await
        .unwrap();
    assert_eq!(a.mtime, fine);
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    let meta = store.head("new").await.unwrap();
    assert_eq!(meta.metadata[MTIME_KEY], "1600000000");
    assert_eq!(
        meta.metadata[MTIME_PRECISE_KEY],
        "2020-09-13T12:26:40.123456700Z"
    );

    // A modified file is uploaded with its new time in both keys, not the old precise one.
    let h = fs.open(f.ino, W).await.unwrap();
    fs.write(h.fh, 0, b"BODY").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    let local = fs.getattr(f.ino).await.unwrap().mtime;
    assert_ne!(local, fine);
    assert_eq!(fs.drain(false).await, 0);
    let meta = store.head("f").await.unwrap();
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"BODY");
    let want: HashMap<String, String> = crate::store::mtime_metadata(local).into_iter().collect();
    assert_eq!(meta.metadata[MTIME_KEY], want[MTIME_KEY]);
    assert_eq!(meta.metadata[MTIME_PRECISE_KEY], want[MTIME_PRECISE_KEY]);
    assert_eq!(meta.mtime(), local);
}

#[tokio::test]
async fn touch_and_chmod_of_a_file_in_the_bucket_patch_metadata_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("f", vec![7u8; 100_000]);
    let mut cfg = MountConfig::new("bkt");
    cfg.posix_metadata = true;
    cfg.posix_uids = vec![1234];
    cfg.posix_gids = vec![5678];
    let fs = Filesystem::with_write(store.clone(), cfg, wcfg(dir.path(), 0)).unwrap();
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    let generation = store.head("f").await.unwrap().generation;
    let writes = || store.counts.write.load(std::sync::atomic::Ordering::SeqCst);
    let gets = || store.counts.get.load(std::sync::atomic::Ordering::SeqCst);
    let (w0, g0) = (writes(), gets());

    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    let a = fs.setattr(f.ino, None, Some(t), None).await.unwrap();
    assert_eq!(a.mtime, t);
    let posix = Posix {
        mode: Some(0o640),
        uid: Some(1234),
        gid: Some(5678),
    };
    let a = fs.set_posix(f.ino, posix, None).await.unwrap();
    assert_eq!((a.perm, a.uid, a.gid), (0o640, 1234, 5678));
    assert_eq!(
        (writes() - w0, gets() - g0),
        (2, 0),
        "two patches, no upload"
    );
    let meta = store.head("f").await.unwrap();
    assert_eq!(meta.generation, generation, "content untouched");
    assert_eq!(meta.metadata[MTIME_KEY], "1600000000");
    assert_eq!(
        meta.metadata[MTIME_PRECISE_KEY],
        "2020-09-13T12:26:40.000000000Z"
    );
    assert_eq!(Posix::from_metadata(&meta.metadata), posix);

    // A modified file keeps its mode and owner.
    let h = fs.open(f.ino, W).await.unwrap();
    fs.write(h.fh, 0, b"new").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    fs.drain(false).await;
    let meta = store.head("f").await.unwrap();
    assert_ne!(meta.generation, generation);
    assert_eq!(Posix::from_metadata(&meta.metadata), posix);
    assert_eq!(&store.object_bytes("f").unwrap()[..3], b"new");

    // Without --posix-metadata chmod is accepted and ignored.
    let plain = writable(&store, &dir.path().join("2"));
    let f = plain.lookup(ROOT_INO, "f").await.unwrap();
    let before = writes();
    let a = plain
        .set_posix(
            f.ino,
            Posix {
                mode: Some(0o600),
                ..Posix::default()
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(a.perm, MountConfig::new("bkt").file_mode);
    assert_eq!(writes(), before);
}

/// The kernel takes an empty `readdir` answer for the end of the directory. A page of the
/// bucket listing that holds only the hidden parts folder must not become one: a file that
/// exists only as a staged write (listed after the bucket's pages) would vanish from `ls`.
/// Found by the soak: after a remount, a replayed file uploading in parts was missing.
#[tokio::test]
async fn a_listing_page_of_only_hidden_parts_does_not_end_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert(&format!("{TEMP_DIR}/abc/1/00000"), "part");
    let mut wc = wcfg(dir.path(), 60_000);
    wc.cache_dir = dir.path().join("c");
    let fs = Filesystem::with_write(store.clone(), MountConfig::new("bkt"), wc).unwrap();
    write_file(&fs, ROOT_INO, "staged", b"12345").await;
    let fh = fs.opendir(ROOT_INO).await.unwrap().fh;
    let names: Vec<String> = readdir_all(&fs, fh)
        .await
        .into_iter()
        .map(|e| e.name)
        .collect();
    fs.releasedir(fh);
    assert_eq!(names, vec![".", "..", "staged"]);
}

/// A posix-metadata mount as a security boundary: whoever can write the bucket can write
/// `goog-reserved-posix-*`, but decides content only. A setuid-root object shows as an
/// ordinary file of the mount's owner; only the opt-ins show what the metadata says.
#[tokio::test]
async fn bucket_writers_do_not_decide_local_permissions() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let hostile: HashMap<String, String> = [
        ("goog-reserved-posix-mode", "104755"),
        ("goog-reserved-posix-uid", "0"),
        ("goog-reserved-posix-gid", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let opts = crate::store::WriteOptions {
        metadata: hostile,
        ..Default::default()
    };
    let plant = || async {
        let script = Bytes::from_static(b"#!/bin/sh\n");
        store
            .put("suid", script, Precondition::None, &opts)
            .await
            .unwrap();
    };
    plant().await;
    let mut cfg = MountConfig::new("bkt");
    cfg.posix_metadata = true;
    cfg.uid = 1000;
    cfg.gid = 1000;
    let fs = Filesystem::with_write(store.clone(), cfg.clone(), wcfg(dir.path(), 0)).unwrap();
    let a = fs.lookup(ROOT_INO, "suid").await.unwrap();
    assert_eq!(
        (a.perm, a.uid, a.gid),
        (0o755, 1000, 1000),
        "no setuid, not root's"
    );

    // chmod keeps no special bit; chown to an owner the mount does not show is refused.
    let set = fs
        .set_posix(
            a.ino,
            Posix {
                mode: Some(0o4750),
                uid: None,
                gid: None,
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(set.perm, 0o750);
    assert_eq!(
        store.head("suid").await.unwrap().metadata["goog-reserved-posix-mode"],
        "750"
    );
    let chown = fs
        .set_posix(
            a.ino,
            Posix {
                mode: None,
                uid: Some(4242),
                gid: None,
            },
            None,
        )
        .await;
    assert!(matches!(chown, Err(FsError::NotPermitted(_))), "{chown:?}");
    assert_eq!(
        store.head("suid").await.unwrap().metadata["goog-reserved-posix-uid"],
        "0"
    );
    drop(fs);

    // Opted in: what the metadata says.
    let other = tempfile::tempdir().unwrap();
    plant().await;
    cfg.posix_special_modes = true;
    cfg.posix_uids = vec![0];
    cfg.posix_gids = vec![0];
    let fs = Filesystem::with_write(store.clone(), cfg, wcfg(other.path(), 0)).unwrap();
    let a = fs.lookup(ROOT_INO, "suid").await.unwrap();
    assert_eq!((a.perm, a.uid, a.gid), (0o4755, 0, 0));
}

/// With --posix-metadata a new file shows the mode its creator asked for (the kernel applied
/// the umask), before its upload and after, and the object carries it.
#[tokio::test]
async fn a_new_file_keeps_the_mode_it_was_created_with() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let mut cfg = MountConfig::new("bkt");
    cfg.posix_metadata = true;
    cfg.stat_ttl = Duration::ZERO;
    let fs = Filesystem::with_write(store.clone(), cfg, wcfg(dir.path(), 0)).unwrap();
    let flags = CreateFlags {
        exclusive: false,
        mode: Some(0o600),
        process: None,
    };
    let (a, h) = fs.create_with(ROOT_INO, "private", flags).await.unwrap();
    assert_eq!(a.perm, 0o600, "as created");
    fs.write(h.fh, 0, b"secret").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    assert_eq!(
        fs.getattr(a.ino).await.unwrap().perm,
        0o600,
        "before its upload"
    );
    fs.drain(false).await;
    let meta = store.head("private").await.unwrap();
    assert_eq!(meta.metadata["goog-reserved-posix-mode"], "600");
    let again = fs.lookup(ROOT_INO, "private").await.unwrap();
    assert_eq!(again.perm, 0o600, "after its upload");
}

/// Nothing is made in the root's parts folder through the mount: it is hidden from listings
/// and its objects are taken for temporary parts.
#[tokio::test]
async fn nothing_is_made_in_the_parts_folder() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert(
        &format!("{TEMP_DIR}/0123456789abcdef/0000000000000001/1/00000"),
        "part",
    );
    let fs = writable(&store, dir.path());
    let refused = |r: &FsError| matches!(r, FsError::PermissionDenied(_));
    assert!(refused(&fs.create(ROOT_INO, TEMP_DIR).await.unwrap_err()));
    assert!(refused(&fs.mkdir(ROOT_INO, TEMP_DIR).await.unwrap_err()));
    assert!(refused(
        &fs.symlink(ROOT_INO, TEMP_DIR, "x").await.unwrap_err()
    ));
    let parts = fs.lookup(ROOT_INO, TEMP_DIR).await.unwrap();
    assert!(refused(
        &fs.create(parts.ino, "mine.txt").await.unwrap_err()
    ));
    assert!(refused(&fs.mkdir(parts.ino, "d").await.unwrap_err()));
    let (a, h) = fs.create(ROOT_INO, "f").await.unwrap();
    fs.release(h.fh).await;
    let _ = a;
    let e = fs.rename(ROOT_INO, "f", parts.ino, "f").await.unwrap_err();
    assert!(refused(&e), "{e:?}");
    // What is there cannot be changed, renamed or removed either.
    let part = "0123456789abcdef";
    let tag = fs.lookup(parts.ino, part).await.unwrap();
    assert!(refused(&fs.rmdir(parts.ino, part).await.unwrap_err()));
    let e = fs
        .rename(ROOT_INO, TEMP_DIR, ROOT_INO, "mine")
        .await
        .unwrap_err();
    assert!(refused(&e), "{e:?}");
    assert!(refused(&fs.rmdir(ROOT_INO, TEMP_DIR).await.unwrap_err()));
    let id = fs.lookup(tag.ino, "0000000000000001").await.unwrap();
    let seq = fs.lookup(id.ino, "1").await.unwrap();
    let obj = fs.lookup(seq.ino, "00000").await.unwrap();
    assert!(refused(&fs.unlink(seq.ino, "00000").await.unwrap_err()));
    assert!(refused(&fs.open(obj.ino, W).await.unwrap_err()));
    assert_eq!(
        store
            .object_bytes(&format!(
                "{TEMP_DIR}/0123456789abcdef/0000000000000001/1/00000"
            ))
            .unwrap(),
        "part".as_bytes()
    );
    // A mount of a prefix keeps its parts in PREFIX/.bucketdrive-parts: reserved there too.
    let sub = fs.mkdir(ROOT_INO, "sub").await.unwrap();
    assert!(refused(&fs.create(sub.ino, TEMP_DIR).await.unwrap_err()));
}

/// A hostile (or just busy) bucket writer attaches kilobytes of custom metadata to every
/// object: the mount keeps only the keys it reads, so listing many such objects costs memory
/// by the name, and an upload of a modified file still keeps every key another tool wrote
/// (one extra request at the open for writing, for such objects only).
#[tokio::test]
async fn only_the_metadata_we_read_is_kept_and_an_upload_keeps_all() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let big = "x".repeat(8 * 1024);
    let metadata: HashMap<String, String> = [
        ("owner-notes".to_string(), big.clone()),
        (
            "goog-reserved-file-mtime".to_string(),
            "1600000000".to_string(),
        ),
    ]
    .into_iter()
    .collect();
    let opts = crate::store::WriteOptions {
        metadata: metadata.clone(),
        ..Default::default()
    };
    for name in ["a", "b"] {
        store
            .put(
                name,
                Bytes::from_static(b"hello"),
                Precondition::None,
                &opts,
            )
            .await
            .unwrap();
    }
    store.insert("plain", "plain");
    let mut cfg = MountConfig::new("bkt");
    cfg.stat_ttl = Duration::from_secs(60);
    let fs = Filesystem::with_write(store.clone(), cfg, wcfg(dir.path(), 0)).unwrap();
    // Through a listing and through a lookup alike.
    let fh = fs.opendir(ROOT_INO).await.unwrap().fh;
    let mut offset = 0;
    loop {
        let batch = fs.readdir(fh, offset).await.unwrap();
        let Some(last) = batch.last() else { break };
        offset = last.offset;
    }
    fs.releasedir(fh);
    for name in ["a", "b"] {
        let attr = fs.lookup(ROOT_INO, name).await.unwrap();
        let kept = fs.ns.current_meta(attr.ino).expect("a file");
        assert!(kept.metadata_trimmed, "{name}");
        assert!(
            !kept.metadata.contains_key("owner-notes"),
            "{name} keeps 8 KiB nobody reads"
        );
        assert_eq!(kept.metadata["goog-reserved-file-mtime"], "1600000000");
        assert_eq!(
            attr.mtime,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000)
        );
    }
    let heads = || store.counts.head.load(std::sync::atomic::Ordering::SeqCst);
    let plain = fs.lookup(ROOT_INO, "plain").await.unwrap();
    let before = heads();
    let h = fs.open(plain.ino, W).await.unwrap();
    fs.release(h.fh).await;
    assert_eq!(
        heads(),
        before,
        "an object without extra metadata costs no extra request"
    );

    let a = fs.lookup(ROOT_INO, "a").await.unwrap();
    let before = heads();
    let h = fs.open(a.ino, W).await.unwrap();
    assert_eq!(heads(), before + 1, "one request for the whole metadata");
    fs.write(h.fh, 5, b", world").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    fs.drain(false).await;
    assert_eq!(&store.object_bytes("a").unwrap()[..], b"hello, world");
    let up = store.head("a").await.unwrap();
    assert_eq!(
        up.metadata.get("owner-notes"),
        Some(&big),
        "the upload keeps every key"
    );
}

/// An unmount right after a close: the kernel's release of the file is received but not yet
/// run when the session ends. The unmount's finish (`lifecycle::finish`: settle the releases,
/// then drain) waits for it, and the file's writes, made a version only by the last handle's
/// release here, are in the bucket when it returns, not left staged. (On a mount whose files
/// the kernel writes itself, the release is also where a closed file's version is sealed, and
/// a drain that looked in the middle of it gave the file up as failed.)
#[tokio::test]
async fn the_finish_of_an_unmount_waits_for_a_release_received_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = Arc::new(writable(&store, dir.path()));
    let (_, h) = fs.create(ROOT_INO, "saved.bin").await.unwrap();
    fs.write(h.fh, 0, b"written just before the stop")
        .await
        .unwrap();
    // What the adapter does as the release arrives; the task that runs it starts late.
    let under_way = fs.begin_release();
    let finish = tokio::spawn({
        let fs = fs.clone();
        async move {
            assert!(fs.settle_releases().await);
            fs.drain(true).await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !finish.is_finished(),
        "the finish went on before the release ran"
    );
    fs.release(h.fh).await;
    drop(under_way);
    assert_eq!(finish.await.unwrap(), 0);
    assert_eq!(
        &store.object_bytes("saved.bin").unwrap()[..],
        b"written just before the stop"
    );
}
