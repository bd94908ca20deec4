//! The read cache over `MemoryStore`, whose GET counter proves where bytes came from. Every
//! test compares what is read with the object's bytes.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::read::{PrefetchConfig, ReadBudget, Reader};
use crate::store::memory::MemoryStore;
use crate::FsError;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn cfg() -> PrefetchConfig {
    PrefetchConfig {
        part_size: 256 * 1024,
        concurrency: 4,
        max_concurrency: 4,
        initial_window: 64 * 1024,
        align: 64 * 1024,
        slack: 1024 * 1024,
    }
}

const QUEUE: u64 = 64 << 20;

fn open(dir: &Path, size: u64) -> ReadCache {
    ReadCache::open(&ReadCacheConfig {
        root: dir.join(SUBDIR),
        size,
        lock_wait: Duration::ZERO,
        fill_queue: QUEUE,
    })
    .unwrap()
}

async fn reader_of(
    store: &Arc<MemoryStore>,
    cache: &ReadCache,
    meta: &ObjectMeta,
    part_size: u64,
) -> Reader<MemoryStore> {
    let c = cache.object("bkt", meta).await;
    let mut cfg = cfg();
    cfg.part_size = part_size;
    Reader::new(store.clone(), meta, ReadBudget::new(1 << 30), cfg).with_cache(c)
}

/// Reads `key` from start to end through a new handle on the cache.
async fn read_all(store: &Arc<MemoryStore>, cache: &ReadCache, key: &str) -> Vec<u8> {
    let meta = store.head(key).await.unwrap();
    read_meta(store, cache, &meta).await
}

async fn read_meta(store: &Arc<MemoryStore>, cache: &ReadCache, meta: &ObjectMeta) -> Vec<u8> {
    let mut r = reader_of(store, cache, meta, 256 * 1024).await;
    let mut out = Vec::new();
    loop {
        let b = r.read(out.len() as u64, 128 * 1024).await.unwrap();
        if b.is_empty() {
            break;
        }
        out.extend_from_slice(&b);
    }
    out
}

fn gets(store: &MemoryStore) -> u64 {
    store.counts.get.load(Ordering::SeqCst)
}

/// Waits for the cache's writer. The bound only catches a hang: on a crowded machine the
/// eviction test's hand-offs between threads take far longer than when idle.
fn flush(cache: &ReadCache) {
    assert!(cache.flush(Duration::from_secs(300)), "the writer finished");
}

/// The one cached generation's file with `extension` (`data` or `index`): the test put one
/// object there.
fn the_file_of(dir: &Path, extension: &str) -> PathBuf {
    let mut files: Vec<_> = std::fs::read_dir(dir.join(SUBDIR).join("objects"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    let f = files
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == extension))
        .unwrap();
    f
}

/// The one cached generation's data file.
fn the_file(dir: &Path) -> PathBuf {
    the_file_of(dir, "data")
}

/// Windows: the bytes `path` takes on disk (what a sparse file really uses), its
/// allocation size.
#[cfg(windows)]
fn allocated(path: &Path) -> u64 {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Storage::FileSystem::{
        FileStandardInfo, GetFileInformationByHandleEx, FILE_STANDARD_INFO,
    };
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: plain data, filled in by the call.
    let mut info: FILE_STANDARD_INFO = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is as large as the class asks for, and the handle is ours.
    let ok = unsafe {
        GetFileInformationByHandleEx(
            f.as_raw_handle(),
            FileStandardInfo,
            (&mut info as *mut FILE_STANDARD_INFO).cast(),
            std::mem::size_of::<FILE_STANDARD_INFO>() as u32,
        )
    };
    assert_ne!(ok, 0, "{}", std::io::Error::last_os_error());
    info.AllocationSize as u64
}

/// Disk bytes every file under `dir` takes.
fn disk_use(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = std::fs::symlink_metadata(e.path()).unwrap();
        n += if m.is_dir() {
            disk_use(&e.path())
        } else {
            #[cfg(unix)]
            let bytes = std::os::unix::fs::MetadataExt::blocks(&m) * 512;
            #[cfg(windows)]
            let bytes = allocated(&e.path());
            bytes
        };
    }
    n
}

fn id_of(meta: &ObjectMeta) -> Identity {
    Identity::new("bkt", meta).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reread_is_served_from_disk_even_after_reopening_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let data = pattern(1_000_123, 1);
    store.insert("obj", data.clone());
    let cache = open(dir.path(), 1 << 30);
    assert_eq!(read_all(&store, &cache, "obj").await, data);
    flush(&cache);
    let first = gets(&store);
    let s = cache.stats();
    assert_eq!(s.written_bytes, data.len() as u64, "{s:?}");
    assert_eq!(s.files, 1);

    assert_eq!(read_all(&store, &cache, "obj").await, data);
    assert_eq!(gets(&store), first, "a re-read sends no GET");
    assert!(cache.stats().hit_bytes >= data.len() as u64);

    // A new cache over the same directory (the next mount) serves it too.
    drop(cache);
    let cache = open(dir.path(), 1 << 30);
    assert_eq!(cache.stats().files, 1);
    assert_eq!(read_all(&store, &cache, "obj").await, data);
    // Random reads (demand fetches) too.
    let meta = store.head("obj").await.unwrap();
    let mut r = reader_of(&store, &cache, &meta, 256 * 1024).await;
    for off in [900_000u64, 5, 640_000, 1_000_000, 300_001] {
        let b = r.read(off, 70_000).await.unwrap();
        let end = (off as usize + 70_000).min(data.len());
        assert_eq!(&b[..], &data[off as usize..end], "at {off}");
    }
    assert_eq!(gets(&store), first, "every byte came from disk");
    assert_eq!(cache.stats().miss_bytes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_object_is_read_new_and_a_pinned_reader_never_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let old = pattern(700_000, 1);
    let new = pattern(700_000, 2);
    store.insert("obj", old.clone());
    let old_meta = store.head("obj").await.unwrap();
    let cache = open(dir.path(), 1 << 30);
    assert_eq!(read_all(&store, &cache, "obj").await, old);
    flush(&cache);
    let before = gets(&store);

    store.insert("obj", new.clone());
    assert_eq!(
        read_all(&store, &cache, "obj").await,
        new,
        "the new generation"
    );
    assert!(gets(&store) > before, "it came from the bucket");
    flush(&cache);
    assert_eq!(cache.stats().files, 2, "one file per generation");
    // Read again: the new bytes, now from disk.
    let now = gets(&store);
    assert_eq!(read_all(&store, &cache, "obj").await, new);
    assert_eq!(gets(&store), now);
    // A handle still on the old generation reads the old bytes, whole (from disk: that
    // generation is gone from the bucket), never the new ones.
    assert_eq!(read_meta(&store, &cache, &old_meta).await, old);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_block_is_detected_dropped_and_refetched() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let data = pattern(1_000_000, 3);
    store.insert("obj", data.clone());
    let cache = open(dir.path(), 1 << 30);
    assert_eq!(read_all(&store, &cache, "obj").await, data);
    flush(&cache);
    // Flip a byte of block 3 on disk.
    let path = the_file(dir.path());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(&path)
        .unwrap();
    let at = 3 * BLOCK + 17;
    let mut b = [0u8; 1];
    platform::read_exact_at(&f, &mut b, at).unwrap();
    platform::write_all_at(&f, &[b[0] ^ 0x40], at).unwrap();
    drop(f);

    let before = gets(&store);
    assert_eq!(
        read_all(&store, &cache, "obj").await,
        data,
        "the right bytes"
    );
    assert_eq!(cache.stats().corrupt_blocks, 1);
    assert!(gets(&store) > before, "the bad block was fetched again");
    flush(&cache);
    // Rewritten: served from disk again, without a new alarm.
    let now = gets(&store);
    assert_eq!(read_all(&store, &cache, "obj").await, data);
    assert_eq!(gets(&store), now);
    assert_eq!(cache.stats().corrupt_blocks, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_or_foreign_index_only_costs_a_refetch() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let data = pattern(600_000, 4);
    store.insert("obj", data.clone());
    let meta = store.head("obj").await.unwrap();
    let id = id_of(&meta);
    let records_at = id.record_at(0);
    for damage in ["cut records", "bad record", "bad header", "empty file"] {
        let cache = open(dir.path(), 1 << 30);
        assert_eq!(
            read_all(&store, &cache, "obj").await,
            data,
            "{damage}: before"
        );
        flush(&cache);
        drop(cache);
        let path = the_file_of(dir.path(), "index");
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        match damage {
            // Torn: the last records never made it.
            "cut records" => f.set_len(records_at + 8 * 4).unwrap(),
            "bad record" => platform::write_all_at(&f, &[0xff; 3], records_at + 8 * 2 + 1).unwrap(),
            "bad header" => platform::write_all_at(&f, b"garbage", 40).unwrap(),
            _ => f.set_len(0).unwrap(),
        }
        drop(f);
        let cache = open(dir.path(), 1 << 30);
        let before = gets(&store);
        assert_eq!(
            read_all(&store, &cache, "obj").await,
            data,
            "{damage}: after"
        );
        assert!(
            gets(&store) > before,
            "{damage}: the damaged part came from the bucket"
        );
        assert_eq!(
            cache.stats().corrupt_blocks,
            0,
            "{damage}: absent, not corrupt"
        );
        flush(&cache);
        // Repaired by the read.
        let now = gets(&store);
        assert_eq!(
            read_all(&store, &cache, "obj").await,
            data,
            "{damage}: repaired"
        );
        assert_eq!(gets(&store), now, "{damage}: repaired");
        drop(cache);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_is_never_exceeded_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let cap = 700 * 1024;
    let cache = open(dir.path(), cap);
    let mut objects = Vec::new();
    for i in 0..30u8 {
        let size = 40_000 + (i as usize * 37_337) % 300_000;
        let data = pattern(size, i);
        store.insert(&format!("o{i}"), data.clone());
        objects.push(data);
    }
    // One object bigger than the whole cache: kept in part.
    let big = pattern(2_000_000, 99);
    store.insert("big", big.clone());
    let mut full_read_gets = 0;
    for round in 0..2 {
        for (i, data) in objects.iter().enumerate() {
            assert_eq!(&read_all(&store, &cache, &format!("o{i}")).await, data);
            flush(&cache);
            let s = cache.stats();
            let on_disk = disk_use(&dir.path().join(SUBDIR));
            assert!(
                s.used <= cap,
                "round {round} object {i}: charged {} > {cap}",
                s.used
            );
            assert!(
                on_disk <= cap,
                "round {round} object {i}: {on_disk} bytes on disk > {cap}"
            );
            assert!(
                on_disk <= s.used,
                "charges cover the disk: {on_disk} > {}",
                s.used
            );
        }
        let before = gets(&store);
        assert_eq!(read_all(&store, &cache, "big").await, big);
        if round == 0 {
            full_read_gets = gets(&store) - before;
        }
        flush(&cache);
        assert!(disk_use(&dir.path().join(SUBDIR)) <= cap);
    }
    let s = cache.stats();
    assert!(s.evicted_files > 20, "{s:?}");
    // The head of the big object stayed: a re-read needs fewer GETs than a cold one.
    let before = gets(&store);
    assert_eq!(read_all(&store, &cache, "big").await, big);
    assert!(
        gets(&store) - before < full_read_gets,
        "part of big is on disk"
    );
    // A smaller cap at the next start evicts down to it.
    drop(cache);
    let cache = open(dir.path(), 200 * 1024);
    assert!(cache.stats().used <= 200 * 1024);
    assert!(disk_use(&dir.path().join(SUBDIR)) <= 200 * 1024);
}

/// Runs one read of `key` from disk with `hook` run at point `which` (0: before the file is
/// opened, 1: after), and returns what the read returned.
async fn read_with_hook(
    store: &Arc<MemoryStore>,
    cache: &ReadCache,
    key: &str,
    which: usize,
    hook: Hook,
) -> Vec<u8> {
    {
        let mut h = cache.shared.hooks.lock();
        if which == 0 {
            h.0 = Some(hook);
        } else {
            h.1 = Some(hook);
        }
    }
    let meta = store.head(key).await.unwrap();
    let mut r = reader_of(store, cache, &meta, 4 << 20).await;
    // Far from the start: one demand read, so the hook runs on exactly this read.
    let got = r.read(2_000_000, 300_000).await.unwrap().to_vec();
    *cache.shared.hooks.lock() = (None, None);
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_during_a_read_never_gives_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let data = pattern(3_000_000, 5);
    store.insert("obj", data.clone());
    let meta = store.head("obj").await.unwrap();
    let name = id_of(&meta).name().to_string();
    let want = &data[2_000_000..2_300_000];
    let cache = open(dir.path(), 1 << 30);

    // Evicted after the reader opened the file: it reads the old inode, whose bytes are right.
    read_all(&store, &cache, "obj").await;
    flush(&cache);
    let before = gets(&store);
    let n = name.clone();
    let got = read_with_hook(&store, &cache, "obj", 1, Arc::new(move |s| s.forget(&n))).await;
    assert_eq!(got, want);
    assert_eq!(gets(&store), before, "served by the open file");
    assert_eq!(cache.stats().files, 0, "and the file is gone");

    // Evicted before the reader opened it: nothing there, so from the bucket.
    read_all(&store, &cache, "obj").await;
    flush(&cache);
    let before = gets(&store);
    let n = name.clone();
    let got = read_with_hook(&store, &cache, "obj", 0, Arc::new(move |s| s.forget(&n))).await;
    assert_eq!(got, want);
    assert_eq!(gets(&store), before + 1);

    // Evicted and the name reused by a new, still empty file: every block fails its check,
    // and since the entry changed that is no corruption, just a miss.
    flush(&cache);
    read_all(&store, &cache, "obj").await;
    flush(&cache);
    let before = gets(&store);
    let (n, id) = (name.clone(), id_of(&meta));
    let got = read_with_hook(
        &store,
        &cache,
        "obj",
        0,
        Arc::new(move |s| {
            s.forget(&n);
            s.path(&n).create(&id).unwrap();
        }),
    )
    .await;
    assert_eq!(got, want);
    assert_eq!(gets(&store), before + 1);
    assert_eq!(cache.stats().corrupt_blocks, 0, "no false alarm");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_readers_under_constant_eviction_read_exact_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let mut objects = Vec::new();
    for i in 0..6u8 {
        let data = pattern(300_000 + i as usize * 50_000, i);
        store.insert(&format!("o{i}"), data.clone());
        objects.push(Arc::new(data));
    }
    // Room for about two objects: most fills evict something someone may be reading.
    let cache = Arc::new(open(dir.path(), 800 * 1024));
    let tasks: Vec<_> = (0..4u64)
        .map(|t| {
            let (store, cache, objects) = (store.clone(), cache.clone(), objects.clone());
            tokio::spawn(async move {
                let mut seed = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let mut next = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed
                };
                for _ in 0..60 {
                    let i = (next() % objects.len() as u64) as usize;
                    let data = &objects[i];
                    let meta = store.head(&format!("o{i}")).await.unwrap();
                    let mut r = reader_of(&store, &cache, &meta, 128 * 1024).await;
                    for _ in 0..4 {
                        let off = next() % data.len() as u64;
                        let len = (next() % 200_000) as u32 + 1;
                        let b = r.read(off, len).await.unwrap();
                        let end = (off as usize + len as usize).min(data.len());
                        assert_eq!(&b[..], &data[off as usize..end], "o{i} at {off}+{len}");
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    flush(&cache);
    let s = cache.stats();
    assert!(s.evicted_files > 0 && s.hit_bytes > 0, "{s:?}");
    assert_eq!(s.corrupt_blocks, 0, "{s:?}");
    assert!(s.used <= 800 * 1024);
    assert!(disk_use(&dir.path().join(SUBDIR)) <= 800 * 1024);
}

// The gate is held across awaits on purpose: only the writer thread (not a task) waits on it.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_never_wait_for_the_cache_writer() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let data = pattern(80 << 20, 6);
    store.insert("obj", data.clone());
    let meta = store.head("obj").await.unwrap();
    let cache = open(dir.path(), 1 << 30);
    // Stall the writer: the read must still finish, dropping what does not fit the queue.
    let gate = cache.shared.gate.lock();
    let mut r = reader_of(&store, &cache, &meta, 8 << 20).await;
    let mut got = Vec::with_capacity(data.len());
    while got.len() < data.len() {
        let b = r.read(got.len() as u64, 1 << 20).await.unwrap();
        got.extend_from_slice(&b);
    }
    assert!(got == data);
    let s = cache.stats();
    assert!(
        s.skipped_bytes >= data.len() as u64 - QUEUE - (8 << 20),
        "{s:?}"
    );
    drop(gate);
    flush(&cache);
    let s = cache.stats();
    assert_eq!(
        s.written_bytes + s.skipped_bytes,
        data.len() as u64,
        "{s:?}"
    );
}

/// Unix only: the disk is made to fail by removing the objects directory under the cache,
/// which Windows refuses while the cache holds it (as it should: platform::Dir).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_cache_disk_never_fails_a_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let data = pattern(500_000, 7);
    store.insert("obj", data.clone());
    let cache = open(dir.path(), 1 << 30);
    std::fs::remove_dir_all(dir.path().join(SUBDIR).join("objects")).unwrap();
    for _ in 0..2 {
        assert_eq!(read_all(&store, &cache, "obj").await, data);
        flush(&cache);
    }
    let s = cache.stats();
    assert!(s.skipped_bytes > 0 && s.written_bytes == 0, "{s:?}");
    assert_eq!(s.files, 0, "failed entries are discarded");
}

#[test]
fn two_mounts_cannot_share_a_read_cache_and_files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path(), 1 << 20);
    let started = std::time::Instant::now();
    let err = ReadCache::open(&ReadCacheConfig {
        root: dir.path().join(SUBDIR),
        size: 1 << 20,
        lock_wait: Duration::from_millis(300),
        fill_queue: QUEUE,
    })
    .unwrap_err();
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it waited first"
    );
    assert!(err.contains("in use by another mount"), "{err}");
    // Private: 0700 and 0600 on Unix (Windows: the protected DACL, platform::windows_acl).
    #[cfg(unix)]
    let mode = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    };
    #[cfg(unix)]
    assert_eq!(mode(&dir.path().join(SUBDIR)), 0o700);
    #[cfg(unix)]
    assert_eq!(mode(&dir.path().join(SUBDIR).join("objects")), 0o700);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("obj", pattern(100_000, 8));
    rt.block_on(read_all(&store, &a, "obj"));
    flush(&a);
    #[cfg(unix)]
    assert_eq!(mode(&the_file(dir.path())), 0o600);
    drop(a);
    // Leftovers of an eviction cut short, an index or a data file alone, and an earlier
    // version's one-file `.cache` are cleaned at the next start.
    let objects = dir.path().join(SUBDIR).join("objects");
    let hex = "0123456789abcdef0123456789abcdef";
    let strays = [
        "x.1.gone-data".to_string(),
        format!("{hex}.index"),
        format!("{}.data", hex.replace('0', "f")),
        format!("{}.cache", hex.replace('1', "e")),
    ];
    for stray in &strays {
        std::fs::write(objects.join(stray), b"x").unwrap();
    }
    let b = open(dir.path(), 1 << 20);
    for stray in &strays {
        assert!(!objects.join(stray).exists(), "{stray}");
    }
    assert_eq!(b.stats().files, 1);
}

/// Reads the file at `ino` whole through the facade, as one open handle.
async fn read_through_mount(fs: &crate::Filesystem<MemoryStore>, ino: crate::Ino) -> Vec<u8> {
    let h = fs
        .open(ino, crate::filesystem::OpenMode::default())
        .await
        .unwrap();
    let mut out = Vec::new();
    loop {
        let b = fs.read(h.fh, out.len() as u64, 128 * 1024).await.unwrap();
        if b.is_empty() {
            break;
        }
        out.extend_from_slice(&b);
    }
    fs.release(h.fh).await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_mount_a_replaced_object_is_read_new_once_open_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let old = pattern(900_000, 10);
    let new = pattern(900_000, 11);
    store.insert("f", old.clone());
    let mut cfg = crate::MountConfig::new("bkt");
    cfg.stat_ttl = Duration::from_millis(200);
    let mut fs = crate::Filesystem::new(store.clone(), cfg);
    fs.set_read_cache(open(dir.path(), 1 << 30));
    let ino = fs.lookup(crate::ROOT_INO, "f").await.unwrap().ino;
    assert_eq!(read_through_mount(&fs, ino).await, old);
    assert!(fs.flush_read_cache(Duration::from_secs(30)));
    let before = gets(&store);
    assert_eq!(read_through_mount(&fs, ino).await, old);
    assert_eq!(gets(&store), before, "the second read came from disk");

    // Replaced, same size. Once the stat TTL has passed, the name is a new inode (the kernel
    // drops its cached pages and attributes with the old one) and the cache reads it new.
    store.insert("f", new.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ino = fs.lookup(crate::ROOT_INO, "f").await.unwrap().ino;
    assert_eq!(read_through_mount(&fs, ino).await, new);
    assert!(gets(&store) > before);
}

/// Asks for `meta`'s file for the kernel to read itself until the background check has
/// answered (at most 10 s).
async fn passthrough_after_check(cache: &ReadCache, meta: &ObjectMeta) -> Option<std::fs::File> {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = cache.passthrough_file("bkt", meta).await;
        let running = {
            let id = id_of(meta);
            let ix = cache.shared.index.lock();
            matches!(ix.whole(id.name()), Some((_, index::Verified::Running)))
        };
        if got.is_some() || std::time::Instant::now() > end {
            return got;
        }
        if !running {
            // The check ended (perhaps between the ask and the look): its answer is the
            // next ask's.
            return cache.passthrough_file("bkt", meta).await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A generation wholly on disk is handed to the kernel (passthrough) only after this mount
/// checked it whole, and then its data file is the object, byte for byte. A partial one is
/// never; a flipped byte found by the check drops that block, counts it, and the next read
/// fetches it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_whole_and_checked_generation_is_passed_through() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let data = pattern(3 * BLOCK as usize + 1234, 9);
    store.insert("obj", data.clone());
    store.insert("part", pattern(8 * BLOCK as usize, 10));
    let meta = store.head("obj").await.unwrap();
    let cache = open(dir.path(), 1 << 30);
    assert!(
        cache.passthrough_file("bkt", &meta).await.is_none(),
        "nothing cached"
    );
    assert_eq!(read_all(&store, &cache, "obj").await, data);
    flush(&cache);
    // The first ask starts the check; it answers once the check passed.
    let mut f = passthrough_after_check(&cache, &meta)
        .await
        .expect("checked whole");
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert!(got == data, "the data file is the object, and nothing more");
    // Part of another object: never.
    let part = store.head("part").await.unwrap();
    let mut r = reader_of(&store, &cache, &part, 256 * 1024).await;
    r.read(0, 64 * 1024).await.unwrap();
    flush(&cache);
    assert!(passthrough_after_check(&cache, &part).await.is_none());
    drop((cache, r));

    // A flipped byte: the next mount's check finds it before any passthrough.
    let path = the_file_of_key(dir.path(), &meta);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut b = [0u8; 1];
    platform::read_exact_at(&f, &mut b, BLOCK + 3).unwrap();
    platform::write_all_at(&f, &[b[0] ^ 1], BLOCK + 3).unwrap();
    drop(f);
    let cache = open(dir.path(), 1 << 30);
    cache.object("bkt", &meta).await;
    assert!(passthrough_after_check(&cache, &meta).await.is_none());
    assert_eq!(cache.stats().corrupt_blocks, 1);
    let before = gets(&store);
    assert_eq!(read_all(&store, &cache, "obj").await, data);
    assert!(gets(&store) > before, "the bad block came from the bucket");
}

/// The data file of `meta`'s generation.
fn the_file_of_key(dir: &Path, meta: &ObjectMeta) -> PathBuf {
    let id = id_of(meta);
    dir.join(SUBDIR)
        .join("objects")
        .join(format!("{}.data", id.name()))
}

/// The whole-object CRC32C check holds when parts come from both places: those fetched from
/// the bucket bring their CRC32C (computed as the bytes arrived), those read back from the
/// cache's disk have theirs computed again, and the two combine. A wrong CRC32C still fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_half_from_disk_half_from_the_bucket_still_checks_the_whole_crc() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let data = pattern(3_000_000, 5);
    store.insert("obj", data.clone());
    let cache = open(dir.path(), 1 << 30);
    let meta = store.head("obj").await.unwrap();
    // The first half only, in the cache.
    let mut r = reader_of(&store, &cache, &meta, 256 * 1024).await;
    let mut off = 0u64;
    while off < 1_500_000 {
        off += r.read(off, 128 * 1024).await.unwrap().len() as u64;
    }
    drop(r);
    flush(&cache);
    let before = gets(&store);

    let mut r = reader_of(&store, &cache, &meta, 256 * 1024).await;
    let mut got = Vec::new();
    loop {
        let b = r.read(got.len() as u64, 128 * 1024).await.unwrap();
        if b.is_empty() {
            break;
        }
        got.extend_from_slice(&b);
    }
    assert!(got == data, "the mixed read returned other bytes");
    assert!(
        gets(&store) > before,
        "the second half came from the bucket"
    );
    assert!(
        cache.stats().hit_bytes > 0,
        "the first half came from the disk"
    );
    assert!(r.stats().crc_verified, "{:?}", r.stats());
    drop(r);

    // The same mix against a wrong CRC32C fails.
    let mut wrong = meta.clone();
    wrong.crc32c = wrong.crc32c.map(|c| c ^ 1);
    let other = tempfile::tempdir().unwrap();
    let cache = open(other.path(), 1 << 30);
    let mut r = reader_of(&store, &cache, &wrong, 256 * 1024).await;
    let mut off = 0u64;
    while off < 1_500_000 {
        off += r.read(off, 128 * 1024).await.unwrap().len() as u64;
    }
    drop(r);
    flush(&cache);
    let mut r = reader_of(&store, &cache, &wrong, 256 * 1024).await;
    let mut off = 0u64;
    let failed = loop {
        match r.read(off, 128 * 1024).await {
            Ok(b) if b.is_empty() => break false,
            Ok(b) => off += b.len() as u64,
            Err(e) => break matches!(e, FsError::Corrupt(_)),
        }
    };
    assert!(
        failed,
        "a whole read against a wrong CRC32C fails as corrupt"
    );
}
