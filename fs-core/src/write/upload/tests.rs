use std::sync::atomic::Ordering;

use super::*;
use crate::store::memory::MemoryStore;

fn source(data: &[u8]) -> (tempfile::NamedTempFile, UploadSource) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, data).unwrap();
    let src = UploadSource::new(
        f.reopen().unwrap(),
        data.len() as u64,
        super::BufferPool::new(64 << 20),
    );
    (f, src)
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn job(key: &str, pre: Precondition, data: &[u8]) -> UploadJob {
    let mut opts = WriteOptions {
        content_type: Some("text/plain".into()),
        ..Default::default()
    };
    opts.metadata
        .insert(crate::store::MTIME_KEY.into(), "1700000000".into());
    UploadJob {
        key: key.into(),
        precondition: pre,
        opts,
        crc32c: crc32c::crc32c(data),
        parts_prefix: ".bucketdrive-parts/tag/0000000000000001-00000000/".into(),
        maybe_landed: Vec::new(),
        conflict_tag: "tag".into(),
    }
}

fn small_cfg(mode: UploadMode) -> UploadConfig {
    UploadConfig {
        single_shot_threshold: 64 * 1024,
        part_size: 16 * 1024,
        concurrency: 4,
        mode,
        chunk_size: 256 * 1024,
        temp_prefix: ".bucketdrive-parts/".into(),
    }
}

fn no_progress(_: UploadState) {}

#[tokio::test]
async fn every_strategy_stores_exact_bytes_and_metadata() {
    for (size, mode) in [
        (0usize, UploadMode::Composite),
        (1000, UploadMode::Composite),
        (64 * 1024, UploadMode::Composite),
        (40 * 16 * 1024 + 7, UploadMode::Composite), // 41 parts: a two-level compose tree
        (600 * 1024 + 3, UploadMode::Resumable),
    ] {
        let store = MemoryStore::new();
        let data = bytes(size, 3);
        let (_f, src) = source(&data);
        let out = upload(
            &store,
            &src,
            &job("k", Precondition::DoesNotExist, &data),
            &small_cfg(mode),
            &UploadState::Staged,
            &no_progress,
        )
        .await
        .unwrap();
        let Outcome::Uploaded(meta) = out else {
            panic!("no conflict expected")
        };
        assert_eq!(
            store.object_bytes("k").unwrap(),
            data,
            "size {size} {mode:?}"
        );
        assert_eq!(meta.crc32c, Some(crc32c::crc32c(&data)));
        assert_eq!(
            meta.metadata
                .get(crate::store::MTIME_KEY)
                .map(String::as_str),
            Some("1700000000")
        );
        assert_eq!(
            store.keys(),
            vec!["k".to_string()],
            "no temporary part is left behind ({size} {mode:?})"
        );
    }
}

#[tokio::test]
async fn a_changed_object_is_kept_and_ours_saved_beside_it() {
    for (size, mode) in [
        (100usize, UploadMode::Composite),
        (200 * 1024, UploadMode::Composite),
        (300 * 1024, UploadMode::Resumable),
    ] {
        let store = MemoryStore::new();
        let opened = store.insert("doc", "original");
        store.insert("doc", "someone else's newer version");
        let data = bytes(size, 9);
        let (_f, src) = source(&data);
        let out = upload(
            &store,
            &src,
            &job(
                "doc",
                Precondition::GenerationMatch(opened.generation),
                &data,
            ),
            &small_cfg(mode),
            &UploadState::Staged,
            &no_progress,
        )
        .await
        .unwrap();
        let Outcome::Conflict(saved) = out else {
            panic!("a conflict was expected")
        };
        assert_eq!(
            &store.object_bytes("doc").unwrap()[..],
            b"someone else's newer version"
        );
        assert!(saved.key.starts_with("doc.conflict-"), "{}", saved.key);
        assert_eq!(store.object_bytes(&saved.key).unwrap(), data);
        assert_eq!(store.keys().len(), 2, "{:?}", store.keys());
    }
}

/// An empty version of ours whose answer was lost is recognised by the mount's tag it carries,
/// also by a later version that is not empty (and so names no writer itself): the sim's seed
/// 451 saved a needless conflict copy after a restart.
#[tokio::test]
async fn a_lost_empty_version_of_ours_is_rebased_on_by_a_later_one() {
    for (theirs, expect_conflict) in [("tag", false), ("another-mount", true)] {
        let store = MemoryStore::new();
        let opened = store.insert("doc", "original");
        let empty = WriteOptions {
            metadata: std::collections::HashMap::from([(
                WRITER_KEY.to_string(),
                theirs.to_string(),
            )]),
            ..Default::default()
        };
        store
            .put(
                "doc",
                Bytes::new(),
                Precondition::GenerationMatch(opened.generation),
                &empty,
            )
            .await
            .unwrap();
        let data = bytes(400, 5);
        let (_f, src) = source(&data);
        let mut j = job(
            "doc",
            Precondition::GenerationMatch(opened.generation),
            &data,
        );
        j.maybe_landed = vec![(crc32c::crc32c(b""), 0)];
        let cfg = small_cfg(UploadMode::Resumable);
        let out = upload(&store, &src, &j, &cfg, &UploadState::Staged, &no_progress)
            .await
            .unwrap();
        match out {
            Outcome::Rebased(m) => {
                assert!(
                    !expect_conflict,
                    "another mount's empty object was taken for ours"
                );
                let mut j = j.clone();
                j.precondition = Precondition::GenerationMatch(m.generation);
                let out = upload(&store, &src, &j, &cfg, &UploadState::Staged, &no_progress)
                    .await
                    .unwrap();
                assert!(matches!(out, Outcome::Uploaded(_)), "{out:?}");
                assert_eq!(store.object_bytes("doc").unwrap(), data);
                assert_eq!(store.keys().len(), 1, "{:?}", store.keys());
            }
            Outcome::Conflict(saved) => {
                assert!(
                    expect_conflict,
                    "our own empty version made a conflict copy"
                );
                assert!(store.object_bytes("doc").unwrap().is_empty());
                assert_eq!(store.object_bytes(&saved.key).unwrap(), data);
            }
            Outcome::Uploaded(_) => panic!("uploaded over an object it never saw"),
        }
    }
}

#[tokio::test]
async fn composite_upload_reuses_parts_already_uploaded() {
    let store = MemoryStore::new();
    let data = bytes(100 * 1024, 1);
    let (_f, src) = source(&data);
    let cfg = small_cfg(UploadMode::Composite);
    let j = job("big", Precondition::DoesNotExist, &data);
    // Parts 0 and 1 were uploaded before a crash, and recorded in the journal.
    let progress = Mutex::new(Vec::new());
    let prefix = j.parts_prefix.clone();
    let mut parts = Vec::new();
    for i in 0..2u32 {
        let chunk = &data[i as usize * 16 * 1024..(i as usize + 1) * 16 * 1024];
        let key = format!("{prefix}{i:05}");
        let m = store.insert(&key, chunk.to_vec());
        parts.push(PartRecord {
            index: i,
            key,
            generation: m.generation,
            crc32c: crc32c::crc32c(chunk),
            offset: u64::from(i) * 16 * 1024,
            len: 16 * 1024,
        });
    }
    let writes_before = store.counts.write.load(Ordering::SeqCst);
    let resume = UploadState::Uploading {
        session_url: None,
        parts,
    };
    let out = upload(&store, &src, &j, &cfg, &resume, &|s| {
        progress.lock().push(s)
    })
    .await
    .unwrap();
    assert!(matches!(out, Outcome::Uploaded(_)));
    assert_eq!(store.object_bytes("big").unwrap(), data);
    // 7 parts in all: 5 uploaded now, plus one compose.
    assert_eq!(
        store.counts.write.load(Ordering::SeqCst) - writes_before,
        5 + 1
    );
    let last = progress.lock().last().cloned().unwrap();
    let UploadState::Uploading { parts, .. } = last else {
        panic!("progress reports parts")
    };
    assert_eq!(parts.len(), 7);
}

#[tokio::test]
async fn resumable_upload_resumes_its_session() {
    let store = MemoryStore::new();
    let data = bytes(700 * 1024, 4);
    let (_f, src) = source(&data);
    let cfg = small_cfg(UploadMode::Resumable);
    let j = job("r", Precondition::DoesNotExist, &data);
    let session = store
        .start_resumable("r", Precondition::DoesNotExist, &WriteOptions::default())
        .await
        .unwrap();
    store
        .upload_chunk(
            &session,
            0,
            Bytes::copy_from_slice(&data[..256 * 1024]),
            None,
        )
        .await
        .unwrap();
    let resume = UploadState::Uploading {
        session_url: Some(session.url.clone()),
        parts: Vec::new(),
    };
    let writes_before = store.counts.write.load(Ordering::SeqCst);
    let out = upload(&store, &src, &j, &cfg, &resume, &no_progress)
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Uploaded(_)));
    assert_eq!(store.object_bytes("r").unwrap(), data);
    // One status query, then the two chunks still missing; no new session, nothing resent.
    assert_eq!(store.counts.write.load(Ordering::SeqCst) - writes_before, 3);
}

#[test]
fn conflict_names_are_utc_stamped_and_carry_the_mount_tag() {
    let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_796_000_000);
    assert_eq!(
        conflict_key("a/b.txt", t, "0123abcd"),
        "a/b.txt.conflict-20261130T005320Z-0123abcd"
    );
}

#[test]
fn part_count_is_bounded() {
    let cfg = UploadConfig::default();
    assert_eq!(part_size_for(100 << 20, &cfg), 32 << 20);
    let huge = 5u64 << 40;
    assert!(huge.div_ceil(part_size_for(huge, &cfg)) <= 1024);
}

/// A staging file cut shorter than its version after the seal (a live version the kernel
/// truncated) fails the upload as changed bytes do, which the engine answers by sealing the
/// file again as it is now; not as an unreadable file retried with backoff.
#[tokio::test]
async fn a_file_shorter_than_its_version_fails_as_changed_bytes() {
    let data = bytes(100 * 1024, 5);
    let (f, src) = source(&data);
    f.as_file().set_len(40 * 1024).unwrap();
    let store = MemoryStore::new();
    for mode in [UploadMode::Composite, UploadMode::Resumable] {
        let err = upload(
            &store,
            &src,
            &job("short", Precondition::DoesNotExist, &data),
            &small_cfg(mode),
            &UploadState::Staged,
            &no_progress,
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind, StoreErrorKind::Other);
        assert!(err.message.contains("staged bytes"), "{mode:?}: {err}");
    }
    assert!(store.object_bytes("short").is_none(), "nothing landed");
}
