use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::config::MountConfig;
use crate::error::FsError;
use crate::filesystem::{Filesystem, OpenMode};
use crate::namespace::{Kind, ROOT_INO};
use crate::store::memory::MemoryStore;
use std::sync::Arc;

fn fs_with(store: Arc<MemoryStore>, prefix: &str) -> Filesystem<MemoryStore> {
    Filesystem::new(store, MountConfig::new("bkt").with_prefix(prefix))
}

/// Lists a whole directory through the facade, taking `take` entries per call like a kernel
/// with a small buffer, and returns (name, kind, size) sorted.
async fn list(fs: &Filesystem<MemoryStore>, ino: u64, take: usize) -> Vec<(String, Kind, u64)> {
    let fh = fs.opendir(ino).await.unwrap().fh;
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let batch = fs.readdir(fh, offset).await.unwrap();
        if batch.is_empty() {
            break;
        }
        for e in batch.into_iter().take(take) {
            offset = e.offset;
            if e.name != "." && e.name != ".." {
                out.push((e.name, e.attr.kind, e.attr.size));
            }
        }
    }
    fs.releasedir(fh);
    out.sort();
    out
}

#[tokio::test]
async fn implicit_and_marker_directories_resolve() {
    let store = Arc::new(MemoryStore::new());
    store.insert("a/b/c.txt", "hello");
    store.insert("m/", "");
    let fs = fs_with(store.clone(), "");
    let a = fs.lookup(ROOT_INO, "a").await.unwrap();
    assert_eq!(a.kind, Kind::Dir);
    let b = fs.lookup(a.ino, "b").await.unwrap();
    assert_eq!(b.kind, Kind::Dir);
    let c = fs.lookup(b.ino, "c.txt").await.unwrap();
    assert_eq!((c.kind, c.size), (Kind::File, 5));
    assert_eq!(fs.lookup(ROOT_INO, "m").await.unwrap().kind, Kind::Dir);
    assert_eq!(
        fs.lookup(ROOT_INO, "nope").await.unwrap_err(),
        FsError::NotFound
    );
    assert_eq!(fs.lookup(c.ino, "x").await.unwrap_err(), FsError::NotDir);
}

#[tokio::test]
async fn negative_and_stat_caches_spare_the_bucket() {
    let store = Arc::new(MemoryStore::new());
    store.insert("f", "x");
    let fs = fs_with(store.clone(), "");
    assert!(fs.lookup(ROOT_INO, "desktop.ini").await.is_err());
    let after_first = store.counts.total();
    for _ in 0..10 {
        assert_eq!(
            fs.lookup(ROOT_INO, "desktop.ini").await.unwrap_err(),
            FsError::NotFound
        );
    }
    fs.lookup(ROOT_INO, "f").await.unwrap();
    let after_f = store.counts.total();
    for _ in 0..10 {
        fs.lookup(ROOT_INO, "f").await.unwrap();
    }
    assert_eq!(
        store.counts.total(),
        after_f,
        "repeated lookups are served from the caches"
    );
    assert!(after_first > 0);
}

#[tokio::test]
async fn directory_wins_over_file_of_same_name() {
    let store = Arc::new(MemoryStore::new());
    store.insert("foo", "file bytes");
    store.insert("foo/inner", "x");
    let fs = fs_with(store.clone(), "");
    assert_eq!(fs.lookup(ROOT_INO, "foo").await.unwrap().kind, Kind::Dir);
    let names = list(&fs, ROOT_INO, usize::MAX).await;
    assert_eq!(names, vec![("foo".to_string(), Kind::Dir, 0)]);
}

#[tokio::test]
async fn readdir_pages_and_resumes_at_any_offset() {
    let store = Arc::new(MemoryStore::new());
    for i in 0..2600 {
        store.insert(&format!("big/f{i:05}"), vec![0u8; i % 7]);
    }
    store.insert("big/sub/x", "x");
    let fs = fs_with(store.clone(), "");
    let big = fs.lookup(ROOT_INO, "big").await.unwrap();
    let all = list(&fs, big.ino, 37).await;
    assert_eq!(all.len(), 2601);
    assert!(all.iter().any(|(n, k, _)| n == "sub" && *k == Kind::Dir));
    assert!(all
        .iter()
        .filter(|(n, _, _)| n.starts_with('f'))
        .all(|(n, _, size)| {
            let i: usize = n[1..].parse().unwrap();
            *size == (i % 7) as u64
        }));
    // readdirplus filled the stat cache: looking up every entry costs nothing.
    let before = store.counts.total();
    for (name, _, _) in all.iter().take(500) {
        fs.lookup(big.ino, name).await.unwrap();
    }
    assert_eq!(store.counts.total(), before);
    // Listing again in one go gives the same answer, and a restart at offset 0 works.
    assert_eq!(list(&fs, big.ino, usize::MAX).await, all);
}

#[tokio::test]
async fn prefix_mount_sees_only_its_prefix() {
    let store = Arc::new(MemoryStore::new());
    store.insert("team/a.txt", "a");
    store.insert("other/b.txt", "b");
    let fs = fs_with(store.clone(), "team");
    let names = list(&fs, ROOT_INO, usize::MAX).await;
    assert_eq!(names, vec![("a.txt".to_string(), Kind::File, 1)]);
    let a = fs.lookup(ROOT_INO, "a.txt").await.unwrap();
    let opened = fs.open(a.ino, OpenMode::default()).await.unwrap();
    assert_eq!(&fs.read(opened.fh, 0, 10).await.unwrap()[..], b"a");
}

#[tokio::test]
async fn replaced_object_is_seen_after_ttl_and_never_mixed() {
    let store = Arc::new(MemoryStore::new());
    store.insert("f", vec![1u8; 100_000]);
    let mut cfg = MountConfig::new("bkt");
    cfg.stat_ttl = Duration::from_millis(50);
    let fs = Filesystem::new(store.clone(), cfg);
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    let h1 = fs.open(f.ino, OpenMode::default()).await.unwrap();
    assert_eq!(fs.read(h1.fh, 0, 10).await.unwrap()[..], [1u8; 10]);
    store.insert("f", vec![2u8; 50]);
    // The old handle never returns bytes of the new generation.
    match fs.read(h1.fh, 90_000, 10).await {
        Ok(b) => assert_eq!(b[..], [1u8; 10]),
        Err(e) => assert_eq!(e, FsError::Stale),
    }
    tokio::time::sleep(Duration::from_millis(80)).await;
    let attr = fs.getattr(f.ino).await.unwrap();
    assert_eq!(attr.size, 50);
    // The kernel keeps its own size for a cached inode, so the resized object gets a new one:
    // opening the old inode says ESTALE (the kernel then looks the name up again).
    assert_eq!(
        fs.open(f.ino, OpenMode::default()).await.unwrap_err(),
        FsError::Stale
    );
    let f2 = fs.lookup(ROOT_INO, "f").await.unwrap();
    assert_ne!(f2.ino, f.ino, "a resized object is a new inode");
    // A descriptor still open on the old inode can fstat it.
    assert!(fs.getattr(f.ino).await.is_ok());
    let h2 = fs.open(f2.ino, OpenMode::default()).await.unwrap();
    assert!(
        !h2.keep_cache,
        "a new generation must drop the kernel's cached pages"
    );
    assert_eq!(fs.read(h2.fh, 0, 100).await.unwrap()[..], [2u8; 50]);
    let h3 = fs.open(f2.ino, OpenMode::default()).await.unwrap();
    assert!(h3.keep_cache, "same generation keeps the page cache");
    // A replacement of the same size is a new inode too: the kernel would otherwise keep the
    // old modification time (and `rsync -a` skip the file).
    store.insert("f", vec![3u8; 50]);
    tokio::time::sleep(Duration::from_millis(80)).await;
    let f3 = fs.lookup(ROOT_INO, "f").await.unwrap();
    assert_ne!(f3.ino, f2.ino, "a same-size replacement is a new inode");
    let h4 = fs.open(f3.ino, OpenMode::default()).await.unwrap();
    assert!(!h4.keep_cache);
    assert_eq!(fs.read(h4.fh, 0, 100).await.unwrap()[..], [3u8; 50]);
}

#[tokio::test]
async fn writes_are_refused_read_only() {
    let store = Arc::new(MemoryStore::new());
    store.insert("f", "x");
    let fs = fs_with(store.clone(), "");
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    let w = OpenMode {
        write: true,
        truncate: false,
        process: None,
    };
    assert_eq!(fs.open(f.ino, w).await.unwrap_err(), FsError::ReadOnly);
    assert_eq!(
        fs.mkdir(ROOT_INO, "d").await.unwrap_err(),
        FsError::ReadOnly
    );
    assert_eq!(
        fs.create(ROOT_INO, "n").await.unwrap_err(),
        FsError::ReadOnly
    );
    assert_eq!(store.counts.write.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn forget_releases_inodes() {
    let store = Arc::new(MemoryStore::new());
    store.insert("f", "x");
    let fs = fs_with(store.clone(), "");
    let base = fs.namespace().inode_count();
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    fs.lookup(ROOT_INO, "f").await.unwrap();
    assert_eq!(fs.namespace().inode_count(), base + 1);
    fs.forget(f.ino, 2);
    assert_eq!(fs.namespace().inode_count(), base);
}

/// The kernel may answer `readdir` from its own cache (`FOPEN_KEEP_CACHE` on a directory) only
/// while the listing it holds is known good: after a whole pass, within the stat TTL, and until
/// a name is seen to come or go.
#[tokio::test]
async fn kernel_keeps_a_listing_only_while_it_is_unchanged() {
    let store = Arc::new(MemoryStore::new());
    store.insert("d/a", vec![1u8; 3]);
    store.insert("d/b", vec![2u8; 3]);
    let mut cfg = MountConfig::new("bkt");
    cfg.stat_ttl = Duration::from_millis(400);
    cfg.negative_ttl = Duration::from_millis(50);
    let fs = Filesystem::new(store.clone(), cfg);
    let d = fs.lookup(ROOT_INO, "d").await.unwrap();

    let first = fs.opendir(d.ino).await.unwrap();
    assert!(
        !first.keep_cache,
        "never listed: nothing in the kernel to keep"
    );
    fs.releasedir(first.fh);
    let names: Vec<_> = list(&fs, d.ino, 100)
        .await
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(names, ["a", "b"]);
    let again = fs.opendir(d.ino).await.unwrap();
    assert!(again.keep_cache, "listed whole just now and unchanged");
    fs.releasedir(again.fh);

    // Another client adds a name; a lookup finds it: the kernel's listing lacks it.
    store.insert("d/c", vec![3u8; 3]);
    tokio::time::sleep(Duration::from_millis(60)).await; // the listing stops vouching for misses
    fs.lookup(d.ino, "c").await.unwrap();
    let after_new = fs.opendir(d.ino).await.unwrap();
    assert!(
        !after_new.keep_cache,
        "a name came that the kernel's listing lacks"
    );
    fs.releasedir(after_new.fh);
    assert_eq!(list(&fs, d.ino, 100).await.len(), 3);
    assert!(fs.opendir(d.ino).await.unwrap().keep_cache);

    // A name the listing has turns out gone.
    crate::store::ObjectStore::delete(store.as_ref(), "d/a", crate::store::Precondition::None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    let expired = fs.opendir(d.ino).await.unwrap();
    assert!(!expired.keep_cache, "older than the stat TTL");
    fs.releasedir(expired.fh);
    assert_eq!(list(&fs, d.ino, 100).await.len(), 2);
    assert!(fs.opendir(d.ino).await.unwrap().keep_cache);
    assert_eq!(
        fs.lookup(d.ino, "zz").await.unwrap_err(),
        FsError::NotFound,
        "a name the listing never had"
    );
    assert!(
        fs.opendir(d.ino).await.unwrap().keep_cache,
        "a miss the listing agrees with changes nothing"
    );
}

/// The kernel is told what is left of the stat TTL, never a fresh one for an answer the
/// mount had cached: otherwise a name looked up late in its cache life (a dentry the kernel
/// dropped, another path to the same name) would be trusted by the kernel for up to twice
/// `--stat-ttl`, and another writer's change would show that much later.
#[tokio::test]
async fn the_kernel_is_given_the_remaining_stat_ttl() {
    let store = Arc::new(MemoryStore::new());
    store.insert("d/f", "hello");
    let mut cfg = MountConfig::new("bkt");
    cfg.stat_ttl = Duration::from_secs(4);
    let fs = Filesystem::new(store.clone(), cfg);
    let d = fs.lookup(ROOT_INO, "d").await.unwrap();
    let f = fs.lookup(d.ino, "f").await.unwrap();
    assert_eq!(
        f.ttl,
        Duration::from_secs(4),
        "an answer from the bucket holds the whole TTL"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Another writer replaced it; the mount's cache still answers for the old one.
    store.insert("d/f", "HELLO");
    let again = fs.lookup(d.ino, "f").await.unwrap();
    assert!(
        again.ttl <= Duration::from_millis(2500),
        "a cached answer holds only what is left of its TTL, not {:?}",
        again.ttl
    );
    let attr = fs.getattr(f.ino).await.unwrap();
    assert!(
        attr.ttl <= Duration::from_millis(2500),
        "getattr: {:?}",
        attr.ttl
    );
    // A listing answers from the bucket: its entries hold the whole TTL again.
    let fh = fs.opendir(d.ino).await.unwrap().fh;
    let mut listed = Vec::new();
    loop {
        let batch = fs
            .readdir(
                fh,
                listed
                    .last()
                    .map_or(0, |e: &crate::namespace::DirEntry| e.offset),
            )
            .await
            .unwrap();
        if batch.is_empty() {
            break;
        }
        listed.extend(batch);
    }
    fs.releasedir(fh);
    let entry = listed.iter().find(|e| e.name == "f").expect("f is listed");
    assert_eq!(entry.attr.ttl, Duration::from_secs(4));
    assert_eq!(entry.attr.size, 5);
}
