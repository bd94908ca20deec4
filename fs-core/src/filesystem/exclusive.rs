//! Exclusive creates and `mkdir` across mounts (I12): two `Filesystem`s on one `MemoryStore`,
//! each with its own cache directory, stand for two machines mounting one bucket. Each test
//! asserts what the bucket holds, not just which call succeeded.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::namespace::ROOT_INO;
use crate::store::memory::MemoryStore;
use crate::store::retry::RetryPolicy;
use crate::store::{Precondition, WriteOptions, WRITER_KEY};
use crate::write::upload::UploadConfig;

const EXCL: CreateFlags = CreateFlags {
    exclusive: true,
    mode: None,
    process: None,
};

fn wcfg(cache: &Path) -> WriteConfig {
    let mut w = WriteConfig::new(cache.to_path_buf());
    w.write_back_delay = Duration::ZERO;
    w.retry_initial = Duration::from_millis(5);
    w.retry_max = Duration::from_millis(20);
    w.upload = UploadConfig {
        single_shot_threshold: 64 * 1024,
        part_size: 16 * 1024,
        ..UploadConfig::default()
    };
    w
}

/// A mount of the shared bucket with its own cache directory; `claim`: `--exclusive-create`.
fn mount(store: &Arc<MemoryStore>, cache: &Path, claim: bool) -> Filesystem<MemoryStore> {
    let mut cfg = MountConfig::new("bkt");
    cfg.exclusive_create = claim;
    Filesystem::with_write(store.clone(), cfg, wcfg(cache)).unwrap()
}

/// Retries as `GcsStore` makes them, quickly: a lost answer is followed by a retry that meets
/// the first try's effect.
pub(super) fn quick_retries() -> Option<RetryPolicy> {
    Some(RetryPolicy {
        max_attempts: 4,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(2),
        max_elapsed: Duration::from_secs(5),
    })
}

/// Looks `name` up in the root and expects it absent: what the kernel does before a create,
/// and what leaves the "not there" answer cached.
async fn absent(fs: &Filesystem<MemoryStore>, name: &str) {
    assert_eq!(
        fs.lookup(ROOT_INO, name).await.unwrap_err(),
        FsError::NotFound
    );
}

async fn write_close(fs: &Filesystem<MemoryStore>, fh: u64, data: &[u8]) {
    fs.write(fh, 0, data).await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await;
}

fn conflict_copies(store: &MemoryStore, key: &str) -> Vec<String> {
    let prefix = format!("{key}.conflict-");
    store
        .keys()
        .into_iter()
        .filter(|k| k.starts_with(&prefix))
        .collect()
}

/// The reported case: `open(O_CREAT|O_EXCL)` of one new name on two machines. With
/// `--exclusive-create` exactly one wins, the other gets `Exists`; the winner's upload
/// replaces its own claim, so the bucket ends with the winner's bytes and nothing else.
#[tokio::test]
async fn exclusive_creates_on_two_mounts_let_exactly_one_win() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let a = mount(&store, &dir.path().join("a"), true);
    let b = mount(&store, &dir.path().join("b"), true);
    absent(&a, "f").await;
    absent(&b, "f").await;
    let (ra, rb) = tokio::join!(
        a.create_with(ROOT_INO, "f", EXCL),
        b.create_with(ROOT_INO, "f", EXCL)
    );
    let (winner, won, lost) = match (ra, rb) {
        (Ok((_, o)), Err(e)) => (&a, o, e),
        (Err(e), Ok((_, o))) => (&b, o, e),
        (ra, rb) => panic!(
            "exactly one create must win: {:?} / {:?}",
            ra.map(|r| r.0.ino),
            rb.map(|r| r.0.ino)
        ),
    };
    assert_eq!(lost, FsError::Exists);
    write_close(winner, won.fh, b"the winner's bytes").await;
    assert_eq!(a.drain(false).await, 0);
    assert_eq!(b.drain(false).await, 0);
    assert_eq!(
        store.object_bytes("f").as_deref(),
        Some(&b"the winner's bytes"[..])
    );
    assert_eq!(
        store.keys(),
        vec!["f"],
        "no conflict copy, no claim left over"
    );
    let meta = store.head("f").await.unwrap();
    assert!(
        !meta.metadata.contains_key(WRITER_KEY),
        "the claim's token went with the claim: {:?}",
        meta.metadata
    );
    // The loser is not left believing the name is free (what it saw there was the claim).
    let loser = if std::ptr::eq(winner, &a) { &b } else { &a };
    assert_eq!(loser.lookup(ROOT_INO, "f").await.unwrap().kind, Kind::File);
}

/// Two exclusive creates of one name on the same mount at once (Windows does not serialise
/// them as the Linux kernel does): the second cannot take the first's claim for its own.
#[tokio::test]
async fn exclusive_creates_on_one_mount_let_exactly_one_win() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    for claim in [false, true] {
        let fs = mount(&store, &dir.path().join(format!("c{claim}")), claim);
        let name = format!("f{claim}");
        absent(&fs, &name).await;
        let (r1, r2) = tokio::join!(
            fs.create_with(ROOT_INO, &name, EXCL),
            fs.create_with(ROOT_INO, &name, EXCL)
        );
        let won: Vec<u64> = [&r1, &r2]
            .iter()
            .filter_map(|r| r.as_ref().ok().map(|(_, o)| o.fh))
            .collect();
        assert_eq!(won.len(), 1, "claim {claim}: {r1:?} / {r2:?}");
        assert!([&r1, &r2].iter().any(|r| matches!(r, Err(FsError::Exists))));
        write_close(&fs, won[0], b"one").await;
        assert_eq!(fs.drain(false).await, 0);
        assert_eq!(store.object_bytes(&name).as_deref(), Some(&b"one"[..]));
        assert!(conflict_copies(&store, &name).is_empty());
    }
}

/// The claim lands but its answer is lost: the retry (the store's own, or the check after the
/// retries ran out) finds our own claim, and that is success, not `Exists`.
#[tokio::test]
async fn a_lost_answer_on_the_claim_is_success() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, &dir.path().join("c"), true);
    for (name, retry) in [("retried", quick_retries()), ("not-retried", None)] {
        store.set_retry(retry);
        absent(&fs, name).await;
        store.lose_next_answers(1);
        let (_, h) = fs
            .create_with(ROOT_INO, name, EXCL)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            store.object_bytes(name).as_deref(),
            Some(&b""[..]),
            "{name}: the name is claimed in the bucket before create returns"
        );
        write_close(&fs, h.fh, name.as_bytes()).await;
        assert_eq!(fs.drain(false).await, 0);
        assert_eq!(store.object_bytes(name).as_deref(), Some(name.as_bytes()));
        assert!(
            conflict_copies(&store, name).is_empty(),
            "{:?}",
            store.keys()
        );
    }
}

/// An empty object another machine put there (a claim of its own, or a plain empty file) is
/// not ours, although its CRC32C and size are those of every empty file: an exclusive create
/// gets `Exists`, and an empty upload of ours that meets it saves a conflict copy.
#[tokio::test]
async fn another_machines_empty_object_is_not_taken_for_ours() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let claiming = mount(&store, &dir.path().join("claiming"), true);
    let local = mount(&store, &dir.path().join("local"), false);
    let theirs = |writer: Option<&str>| WriteOptions {
        metadata: writer
            .map(|w| (WRITER_KEY.to_string(), w.to_string()))
            .into_iter()
            .collect(),
        ..WriteOptions::default()
    };
    for (i, writer) in [None, Some("another-mount"), Some("another-mount.1234")]
        .into_iter()
        .enumerate()
    {
        // The claim meets it.
        let name = format!("claim{i}");
        absent(&claiming, &name).await;
        store
            .put(
                &name,
                Bytes::new(),
                Precondition::DoesNotExist,
                &theirs(writer),
            )
            .await
            .unwrap();
        assert_eq!(
            claiming
                .create_with(ROOT_INO, &name, EXCL)
                .await
                .map(|r| r.0.ino),
            Err(FsError::Exists),
            "{writer:?}"
        );
        // An empty upload meets it.
        let name = format!("upload{i}");
        absent(&local, &name).await;
        let (_, h) = local.create_with(ROOT_INO, &name, EXCL).await.unwrap();
        store
            .put(
                &name,
                Bytes::new(),
                Precondition::DoesNotExist,
                &theirs(writer),
            )
            .await
            .unwrap();
        local.flush(h.fh).await.unwrap();
        local.release(h.fh).await;
        assert_eq!(local.drain(false).await, 0);
        let copies = conflict_copies(&store, &name);
        assert_eq!(copies.len(), 1, "{writer:?}: {:?}", store.keys());
        assert_eq!(store.object_bytes(&copies[0]).as_deref(), Some(&b""[..]));
        let kept = store.head(&name).await.unwrap();
        assert_eq!(
            kept.metadata.get(WRITER_KEY).map(String::as_str),
            writer,
            "the bucket's object is left as it was"
        );
    }
}

/// The upload path's side of the same race: a plain create on one machine, an exclusive one
/// on another. The claim wins; the empty file of the plain create is a conflict copy, not
/// taken for the claim, and the claim's owner writes its bytes over its claim.
#[tokio::test]
async fn an_empty_upload_racing_another_machines_claim_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let claiming = mount(&store, &dir.path().join("claiming"), true);
    let local = mount(&store, &dir.path().join("local"), false);
    absent(&claiming, "e").await;
    absent(&local, "e").await;
    let (_, hc) = claiming.create_with(ROOT_INO, "e", EXCL).await.unwrap();
    let (_, hl) = local.create_with(ROOT_INO, "e", EXCL).await.unwrap();
    local.flush(hl.fh).await.unwrap();
    local.release(hl.fh).await;
    assert_eq!(local.drain(false).await, 0);
    write_close(&claiming, hc.fh, b"claimed").await;
    assert_eq!(claiming.drain(false).await, 0);
    assert_eq!(store.object_bytes("e").as_deref(), Some(&b"claimed"[..]));
    let copies = conflict_copies(&store, "e");
    assert_eq!(copies.len(), 1, "{:?}", store.keys());
    assert_eq!(store.object_bytes(&copies[0]).as_deref(), Some(&b""[..]));
}

/// Our own empty file whose upload answer was lost is still ours (I4): the retry finds an
/// empty object that names this mount.
#[tokio::test]
async fn our_own_empty_upload_whose_answer_was_lost_is_not_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.set_retry(quick_retries());
    for claim in [false, true] {
        let fs = mount(&store, &dir.path().join(format!("c{claim}")), claim);
        let name = format!("empty{claim}");
        absent(&fs, &name).await;
        let (_, h) = fs.create_with(ROOT_INO, &name, EXCL).await.unwrap();
        store.lose_next_answers(1);
        fs.flush(h.fh).await.unwrap();
        fs.release(h.fh).await;
        assert_eq!(fs.drain(false).await, 0);
        assert_eq!(store.object_bytes(&name).as_deref(), Some(&b""[..]));
        assert!(
            conflict_copies(&store, &name).is_empty(),
            "{:?}",
            store.keys()
        );
        let status = fs.write_status().await;
        assert_eq!(status.conflicts, 0, "{status:?}");
    }
}

/// `mkdir` of a marker another mount just made is `Exists`; a lost answer whose retry finds
/// our own marker is success.
#[tokio::test]
async fn mkdir_of_another_mounts_marker_is_exists_and_our_lost_answer_is_success() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let a = mount(&store, &dir.path().join("a"), false);
    let b = mount(&store, &dir.path().join("b"), false);
    absent(&a, "d").await;
    absent(&b, "d").await;
    let (ra, rb) = tokio::join!(a.mkdir(ROOT_INO, "d"), b.mkdir(ROOT_INO, "d"));
    let wins = [&ra, &rb].iter().filter(|r| r.is_ok()).count();
    assert_eq!(wins, 1, "{ra:?} / {rb:?}");
    assert!([&ra, &rb].iter().any(|r| matches!(r, Err(FsError::Exists))));
    assert_eq!(store.keys(), vec!["d/"]);

    for (name, retry) in [("retried", quick_retries()), ("not-retried", None)] {
        store.set_retry(retry);
        absent(&a, name).await;
        absent(&b, name).await;
        store.lose_next_answers(1);
        a.mkdir(ROOT_INO, name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            store.object_bytes(&format!("{name}/")).as_deref(),
            Some(&b""[..])
        );
        // The other mount's mkdir of the same name, which it still thinks free, meets it.
        assert_eq!(b.mkdir(ROOT_INO, name).await.unwrap_err(), FsError::Exists);
    }
}

/// Without `--exclusive-create`, `O_EXCL` is exclusive on this mount only: no bucket request
/// is added to the create (it works offline), and a name this mount knows, staged or in the
/// bucket, is `Exists` rather than emptied.
#[tokio::test]
async fn without_the_option_an_exclusive_create_is_local_and_makes_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.insert("there", "kept");
    let fs = mount(&store, &dir.path().join("c"), false);
    absent(&fs, "new").await;
    fs.lookup(ROOT_INO, "there").await.unwrap();
    let before = store.counts.total();
    store.set_offline(true);
    let (_, h) = fs.create_with(ROOT_INO, "new", EXCL).await.unwrap();
    fs.write(h.fh, 0, b"staged").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    assert_eq!(
        fs.create_with(ROOT_INO, "new", EXCL).await.map(|r| r.0.ino),
        Err(FsError::Exists),
        "a staged name"
    );
    assert_eq!(
        fs.create_with(ROOT_INO, "there", EXCL)
            .await
            .map(|r| r.0.ino),
        Err(FsError::Exists),
        "a name in the bucket"
    );
    assert_eq!(store.counts.total(), before, "no bucket request");
    store.set_offline(false);
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(store.object_bytes("new").as_deref(), Some(&b"staged"[..]));
    assert_eq!(store.object_bytes("there").as_deref(), Some(&b"kept"[..]));
}

/// With the bucket unreachable an exclusive create cannot claim the name: it fails (`EAGAIN`,
/// try again) and leaves nothing behind, staged or in the bucket.
#[tokio::test]
async fn an_exclusive_create_fails_while_the_bucket_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, &dir.path().join("c"), true);
    absent(&fs, "f").await;
    store.set_offline(true);
    let err = fs
        .create_with(ROOT_INO, "f", EXCL)
        .await
        .map(|r| r.0.ino)
        .unwrap_err();
    assert!(matches!(err, FsError::Busy(_)), "{err:?}");
    assert!(store.counts.write.load(Ordering::SeqCst) > 0, "it tried");
    store.set_offline(false);
    assert!(store.keys().is_empty(), "{:?}", store.keys());
    assert_eq!(fs.write_status().await.pending_files, 0);
    // Once the bucket is back the same create works.
    let (_, h) = fs.create_with(ROOT_INO, "f", EXCL).await.unwrap();
    write_close(&fs, h.fh, b"later").await;
    assert_eq!(fs.drain(false).await, 0);
    assert_eq!(store.object_bytes("f").as_deref(), Some(&b"later"[..]));
}

/// A create whose claim succeeded but that is closed with nothing written leaves an empty
/// file, uploaded over the claim: the object is the file, not the claim.
#[tokio::test]
async fn a_claim_closed_empty_becomes_the_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, &dir.path().join("c"), true);
    absent(&fs, "f").await;
    let claim_writes = store.counts.write.load(Ordering::SeqCst);
    let (_, h) = fs.create_with(ROOT_INO, "f", EXCL).await.unwrap();
    assert_eq!(store.counts.write.load(Ordering::SeqCst), claim_writes + 1);
    let claim = store.head("f").await.unwrap();
    fs.flush(h.fh).await.unwrap();
    fs.release(h.fh).await;
    assert_eq!(fs.drain(false).await, 0);
    let file = store.head("f").await.unwrap();
    assert!(
        file.generation > claim.generation,
        "uploaded over the claim"
    );
    assert_eq!(file.size, 0);
    assert!(file.metadata.contains_key(crate::store::MTIME_KEY));
    assert_ne!(
        file.metadata.get(WRITER_KEY),
        claim.metadata.get(WRITER_KEY),
        "the claim's token is not the file's"
    );
    assert_eq!(store.keys(), vec!["f"]);
}
