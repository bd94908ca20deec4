//! The link to the bucket is down (`MemoryStore::set_offline`, every request failing as a dead
//! link does, retried as `GcsStore` retries): what the mount shows from its last known state,
//! what it still refuses, and how long it waits before answering. Waits are measured on
//! tokio's paused clock and in requests, never on the wall clock.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::error::FsError;
use crate::namespace::ROOT_INO;
use crate::store::memory::MemoryStore;
use crate::store::retry::{RetryPolicy, FALLBACK_ATTEMPTS};

/// Uploads wait this long after a close: they never start during a test.
const LATER: Duration = Duration::from_secs(3600);

/// A bucket holding `folder/a.txt`, `folder/b.txt` and `other/x`, whose requests are retried
/// with the production policy.
fn bucket() -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new());
    store.insert("folder/a.txt", &b"alpha"[..]);
    store.insert("folder/b.txt", &b"bravo!"[..]);
    store.insert("other/x", &b"x"[..]);
    store.set_retry(Some(RetryPolicy::default()));
    store
}

/// A read-only mount whose caches forget at once, so every lookup and listing asks the bucket.
fn uncached(store: &Arc<MemoryStore>) -> Filesystem<MemoryStore> {
    let mut cfg = MountConfig::new("bkt");
    cfg.stat_ttl = Duration::ZERO;
    cfg.negative_ttl = Duration::ZERO;
    Filesystem::new(store.clone(), cfg)
}

/// A writable mount whose uploads wait, with no negative caching (so creates ask the bucket).
fn writable(store: &Arc<MemoryStore>, dir: &std::path::Path) -> Filesystem<MemoryStore> {
    let mut cfg = MountConfig::new("bkt");
    cfg.negative_ttl = Duration::ZERO;
    let mut w = WriteConfig::new(dir.join("cache"));
    w.write_back_delay = LATER;
    Filesystem::with_write(store.clone(), cfg, w).unwrap()
}

/// One whole pass over directory `ino`: (name, size) of each entry but `.` and `..`, in the
/// order given, or the first error.
async fn pass(fs: &Filesystem<MemoryStore>, ino: Ino) -> FsResult<Vec<(String, u64)>> {
    let fh = fs.opendir(ino).await?.fh;
    let mut out = Vec::new();
    let mut offset = 0;
    let result = loop {
        match fs.readdir(fh, offset).await {
            Ok(batch) if batch.is_empty() => break Ok(out),
            Ok(batch) => {
                for e in batch {
                    offset = e.offset;
                    if e.name != "." && e.name != ".." {
                        out.push((e.name, e.attr.size));
                    }
                }
            }
            Err(e) => break Err(e),
        }
    };
    fs.releasedir(fh);
    result
}

fn sorted(mut v: Vec<(String, u64)>) -> Vec<(String, u64)> {
    v.sort();
    v
}

fn named(entries: &[(&str, u64)]) -> Vec<(String, u64)> {
    entries.iter().map(|(n, s)| (n.to_string(), *s)).collect()
}

async fn save(fs: &Filesystem<MemoryStore>, parent: Ino, name: &str, data: &[u8]) {
    let (_, h) = fs.create(parent, name).await.unwrap();
    fs.write(h.fh, 0, data).await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
}

/// Case 6: a folder listed, then the link goes down and files are saved into it. Listing it
/// shows its old names and the new ones (with their sizes), after one retry of the one
/// listing request, and the mount says it is offline.
#[tokio::test]
async fn an_offline_listing_shows_the_old_names_and_the_files_saved_since() {
    let dir = tempfile::tempdir().unwrap();
    let store = bucket();
    let fs = writable(&store, dir.path());
    let folder = fs.lookup(ROOT_INO, "folder").await.unwrap();
    let old = named(&[("a.txt", 5), ("b.txt", 6)]);
    assert_eq!(sorted(pass(&fs, folder.ino).await.unwrap()), old);
    assert!(!fs.write_status().await.offline);

    store.set_offline(true);
    for (name, data) in [("new1", &b"one"[..]), ("new2", &b"second"[..])] {
        save(&fs, folder.ino, name, data).await;
    }
    assert_eq!(
        fs.lookup(folder.ino, "new2").await.unwrap().size,
        6,
        "a file saved offline is found"
    );
    let lists = store.counts.list.load(Ordering::SeqCst);
    let listed = pass(&fs, folder.ino)
        .await
        .expect("the folder lists offline");
    assert_eq!(
        sorted(listed),
        named(&[("a.txt", 5), ("b.txt", 6), ("new1", 3), ("new2", 6)])
    );
    assert_eq!(
        store.counts.list.load(Ordering::SeqCst) - lists,
        u64::from(FALLBACK_ATTEMPTS),
        "one listing request and its first retry, then the last known state"
    );
    let status = fs.write_status().await;
    assert!(status.offline, "status says the mount is offline");
    assert_eq!(status.pending_files, 2, "writes are kept as before");

    // An offline answer is not one the kernel may keep: the next open asks again.
    assert!(!fs.opendir(folder.ino).await.unwrap().keep_cache);
}

/// Offline, a lookup in a directory listed whole answers from what the listing showed: the
/// entry (with its attributes) for a name it held, "not there" for any other, each after one
/// retry at most (two attempts of each request, one backoff on the paused clock).
#[tokio::test(start_paused = true)]
async fn an_offline_lookup_answers_from_the_last_listing() {
    let store = bucket();
    let fs = uncached(&store);
    let folder = fs.lookup(ROOT_INO, "folder").await.unwrap();
    pass(&fs, folder.ino).await.unwrap();
    let online = fs.lookup(folder.ino, "b.txt").await.unwrap();

    store.set_offline(true);
    let (heads, lists) = (
        store.counts.head.load(Ordering::SeqCst),
        store.counts.list.load(Ordering::SeqCst),
    );
    let started = tokio::time::Instant::now();
    let b = fs
        .lookup(folder.ino, "b.txt")
        .await
        .expect("a known name offline");
    assert!(
        started.elapsed() <= RetryPolicy::default().initial_backoff,
        "one backoff at most, not the retry budget: {:?}",
        started.elapsed()
    );
    assert_eq!(
        (b.ino, b.kind, b.size, b.generation),
        (online.ino, Kind::File, 6, online.generation)
    );
    assert_eq!(
        store.counts.head.load(Ordering::SeqCst) - heads,
        u64::from(FALLBACK_ATTEMPTS)
    );
    assert_eq!(
        store.counts.list.load(Ordering::SeqCst) - lists,
        u64::from(FALLBACK_ATTEMPTS)
    );
    assert_eq!(
        fs.lookup(folder.ino, "c.txt").await.unwrap_err(),
        FsError::NotFound,
        "a name the listing lacked is not there"
    );
    assert_eq!(
        fs.getattr(b.ino).await.unwrap().size,
        6,
        "getattr too answers from the last known state"
    );
    assert!(fs.write_status().await.offline);
}

/// A directory the mount never listed has no last known state: offline, its lookups and
/// listings still fail as before, after the whole retry budget, and the mount does not say
/// it is offline for that.
#[tokio::test(start_paused = true)]
async fn a_directory_never_listed_still_fails_offline() {
    let store = bucket();
    let fs = uncached(&store);
    let folder = fs.lookup(ROOT_INO, "folder").await.unwrap();
    let other = fs.lookup(ROOT_INO, "other").await.unwrap();
    pass(&fs, folder.ino).await.unwrap();

    store.set_offline(true);
    let lists = store.counts.list.load(Ordering::SeqCst);
    assert!(matches!(
        fs.lookup(other.ino, "x").await,
        Err(FsError::Busy(_))
    ));
    assert!(matches!(pass(&fs, other.ino).await, Err(FsError::Busy(_))));
    let budget = u64::from(RetryPolicy::default().max_attempts);
    assert_eq!(
        store.counts.list.load(Ordering::SeqCst) - lists,
        2 * budget,
        "nothing to fall back on: the whole retry budget, for the probe and the listing"
    );
    assert!(!fs.write_status().await.offline);
    assert_eq!(
        fs.lookup(folder.ino, "a.txt").await.unwrap().size,
        5,
        "the listed folder still answers"
    );
}

/// The offline flag is set by the first answer from the last known state and cleared by the
/// next request the bucket answers; `status` carries it, and a status from a mount that does
/// not know the field reads as online.
#[tokio::test(start_paused = true)]
async fn the_offline_flag_follows_the_bucket() {
    let store = bucket();
    let fs = uncached(&store);
    let folder = fs.lookup(ROOT_INO, "folder").await.unwrap();
    pass(&fs, folder.ino).await.unwrap();
    assert!(!fs.namespace().is_offline());

    store.set_offline(true);
    pass(&fs, folder.ino).await.unwrap();
    assert!(fs.namespace().is_offline());
    assert!(fs.write_status().await.offline);
    // Still offline: another fallback keeps the flag.
    fs.lookup(folder.ino, "a.txt").await.unwrap();
    assert!(fs.write_status().await.offline);

    store.set_offline(false);
    store.insert("folder/c.txt", &b"c"[..]);
    assert_eq!(
        sorted(pass(&fs, folder.ino).await.unwrap()),
        named(&[("a.txt", 5), ("b.txt", 6), ("c.txt", 1)]),
        "back online, the bucket answers"
    );
    assert!(!fs.write_status().await.offline);

    let old: Status = serde_json::from_str(r#"{"pending_files":1,"pending_bytes":2,"uploading_files":0,"uploaded_files":0,"uploaded_bytes":0,"conflicts":0,"failures":0}"#).unwrap();
    assert!(!old.offline);
    let round: Status =
        serde_json::from_str(&serde_json::to_string(&fs.write_status().await).unwrap()).unwrap();
    assert!(!round.offline);
}

/// A listing that the bucket started answering and that fails part-way is not finished from
/// the last known state: the call fails, and a retry at the same offset goes on where it
/// stopped, so the pass holds every name exactly once.
#[tokio::test(start_paused = true)]
async fn a_listing_cut_part_way_fails_cleanly_and_resumes() {
    let store = Arc::new(MemoryStore::new());
    let n = crate::namespace::readdir::PAGE_SIZE as usize + 100;
    for i in 0..n {
        store.insert(&format!("big/f{i:05}"), &b"z"[..]);
    }
    store.set_retry(Some(RetryPolicy::default()));
    let fs = uncached(&store);
    let big = fs.lookup(ROOT_INO, "big").await.unwrap();
    pass(&fs, big.ino).await.unwrap();

    let fh = fs.opendir(big.ino).await.unwrap().fh;
    let mut names = Vec::new();
    let mut offset = 0;
    let mut failed = 0;
    loop {
        // The link goes down once the first page has been handed out in part.
        if names.len() >= 300 && failed == 0 {
            store.set_offline(true);
        }
        match fs.readdir(fh, offset).await {
            Ok(batch) if batch.is_empty() => break,
            Ok(batch) => {
                // Like a kernel with a small buffer: take a few entries per call.
                for e in batch.into_iter().take(100) {
                    offset = e.offset;
                    if e.name != "." && e.name != ".." {
                        names.push(e.name);
                    }
                }
            }
            Err(e) => {
                assert!(matches!(e, FsError::Busy(_)), "{e:?}");
                failed += 1;
                store.set_offline(false);
            }
        }
    }
    fs.releasedir(fh);
    assert_eq!(failed, 1, "the second page failed once");
    let want: Vec<String> = (0..n).map(|i| format!("f{i:05}")).collect();
    assert_eq!(names, want, "every name once, in order");
}

/// A directory renamed away and another renamed onto its name (the soak's seed 3): offline,
/// the name is found at the new directory and the old name is gone, as the renames left them.
/// A rename's outcome is what the last known state holds, never the name's absence.
#[tokio::test]
async fn an_offline_lookup_after_directory_renames_shows_where_they_left_the_names() {
    let dir = tempfile::tempdir().unwrap();
    let store = bucket();
    let fs = writable(&store, dir.path());
    pass(&fs, ROOT_INO).await.unwrap();
    fs.rename(ROOT_INO, "folder", ROOT_INO, "moved")
        .await
        .unwrap();
    fs.rename(ROOT_INO, "other", ROOT_INO, "folder")
        .await
        .unwrap();

    store.set_offline(true);
    let folder = fs
        .lookup(ROOT_INO, "folder")
        .await
        .expect("the directory renamed onto the name is found offline");
    assert_eq!(folder.kind, Kind::Dir);
    assert!(fs.lookup(ROOT_INO, "moved").await.is_ok());
    assert_eq!(
        fs.lookup(ROOT_INO, "other").await.err(),
        Some(FsError::NotFound),
        "the name renamed away is gone"
    );
    let mut names: Vec<String> = pass(&fs, ROOT_INO)
        .await
        .expect("the root lists offline")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    names.sort();
    assert_eq!(names, ["folder", "moved"]);
}
