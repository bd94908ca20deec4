//! `MemoryStore`: an in-memory bucket that follows GCS's generation and precondition rules
//! exactly, for unit and property tests.
//!
//! The emulator ignores preconditions on media and resumable uploads and on reads, so logic that
//! depends on them is tested here. Like a bucket without versioning, only the live generation of
//! each name is kept: reading a replaced generation fails with `NotFound`.
//!
//! It also counts requests by kind and can inject transient failures, so tests can assert what
//! reached the "network".

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::Bytes;
use parking_lot::Mutex;

use super::{
    ByteStream, ChunkOutcome, ListPage, ListRequest, ObjectMeta, ObjectStore, Precondition,
    ResumableSession, StoreError, StoreErrorKind, StoreResult, WriteOptions,
};

#[derive(Debug, Clone)]
struct Stored {
    meta: ObjectMeta,
    data: Bytes,
}

#[derive(Debug)]
struct Upload {
    key: String,
    pre: Precondition,
    opts: WriteOptions,
    data: Vec<u8>,
}

/// Requests seen, by operation.
#[derive(Debug, Default)]
pub struct RequestCounts {
    pub head: AtomicU64,
    pub list: AtomicU64,
    pub get: AtomicU64,
    pub write: AtomicU64,
    pub delete: AtomicU64,
}

impl RequestCounts {
    /// All requests of any kind.
    pub fn total(&self) -> u64 {
        self.head.load(Ordering::SeqCst)
            + self.list.load(Ordering::SeqCst)
            + self.get.load(Ordering::SeqCst)
            + self.write.load(Ordering::SeqCst)
            + self.delete.load(Ordering::SeqCst)
    }
}

/// An in-memory bucket.
#[derive(Debug, Default)]
pub struct MemoryStore {
    objects: Mutex<BTreeMap<String, Stored>>,
    uploads: Mutex<HashMap<String, Upload>>,
    next_generation: AtomicI64,
    /// The next this-many requests fail with a transient error.
    fail_next: AtomicU64,
    pub counts: RequestCounts,
}

impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore {
            next_generation: AtomicI64::new(1_000),
            ..Default::default()
        }
    }

    /// Writes an object unconditionally; a test convenience.
    pub fn insert(&self, key: &str, data: impl Into<Bytes>) -> ObjectMeta {
        self.commit(
            key,
            data.into(),
            Precondition::None,
            &WriteOptions::default(),
        )
        .expect("an unconditional write cannot fail")
    }

    /// Makes the next `n` requests fail with a transient error.
    pub fn fail_next(&self, n: u64) {
        self.fail_next.store(n, Ordering::SeqCst);
    }

    /// The bytes of the live object `key`, if any.
    pub fn object_bytes(&self, key: &str) -> Option<Bytes> {
        self.objects.lock().get(key).map(|s| s.data.clone())
    }

    /// Names of all live objects, in order.
    pub fn keys(&self) -> Vec<String> {
        self.objects.lock().keys().cloned().collect()
    }

    fn injected_failure(&self) -> StoreResult<()> {
        let took = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if took {
            Err(StoreError::new(
                StoreErrorKind::Transient,
                "injected transient failure",
            ))
        } else {
            Ok(())
        }
    }

    fn check(objects: &BTreeMap<String, Stored>, key: &str, pre: Precondition) -> StoreResult<()> {
        let live = objects.get(key).map(|s| s.meta.generation);
        let ok = match pre {
            Precondition::None => true,
            Precondition::DoesNotExist => live.is_none(),
            Precondition::GenerationMatch(g) => live == Some(g),
        };
        if ok {
            Ok(())
        } else {
            Err(StoreError::new(
                StoreErrorKind::PreconditionFailed,
                format!("precondition {pre:?} failed for {key}"),
            ))
        }
    }

    fn commit(
        &self,
        key: &str,
        data: Bytes,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta> {
        if key.is_empty() || key.len() > 1024 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidArgument,
                "invalid object name",
            ));
        }
        let crc = crc32c::crc32c(&data);
        if let Some(want) = opts.crc32c {
            if want != crc {
                return Err(StoreError::new(
                    StoreErrorKind::InvalidArgument,
                    "crc32c mismatch",
                ));
            }
        }
        let mut objects = self.objects.lock();
        Self::check(&objects, key, pre)?;
        let meta = ObjectMeta {
            key: key.to_string(),
            generation: self.next_generation.fetch_add(1, Ordering::SeqCst),
            metageneration: 1,
            size: data.len() as u64,
            crc32c: Some(crc),
            updated: SystemTime::now(),
            content_type: opts.content_type.clone(),
            metadata: opts.metadata.clone(),
        };
        objects.insert(
            key.to_string(),
            Stored {
                meta: meta.clone(),
                data,
            },
        );
        Ok(meta)
    }
}

#[async_trait::async_trait]
impl ObjectStore for MemoryStore {
    async fn head(&self, key: &str) -> StoreResult<ObjectMeta> {
        self.counts.head.fetch_add(1, Ordering::SeqCst);
        self.injected_failure()?;
        self.objects
            .lock()
            .get(key)
            .map(|s| s.meta.clone())
            .ok_or_else(|| StoreError::not_found(key))
    }

    async fn list(&self, req: &ListRequest) -> StoreResult<ListPage> {
        self.counts.list.fetch_add(1, Ordering::SeqCst);
        self.injected_failure()?;
        let max = req.max_results.unwrap_or(1000).max(1) as usize;
        let objects = self.objects.lock();
        let mut page = ListPage::default();
        let mut emitted = 0;
        let mut last: Option<String> = None;
        let start = req.page_token.clone().unwrap_or_else(|| req.prefix.clone());
        let iter = objects.range(start..);
        for (key, stored) in iter {
            if !key.starts_with(&req.prefix) {
                break;
            }
            if req.page_token.as_deref() == Some(key.as_str()) {
                continue;
            }
            let rest = &key[req.prefix.len()..];
            let rolled = req.delimiter.as_deref().and_then(|d| {
                rest.find(d)
                    .map(|i| format!("{}{}", req.prefix, &rest[..i + d.len()]))
            });
            if let Some(p) = &rolled {
                // A token naming a prefix means "after every key under it".
                if req.page_token.as_deref() == Some(p.as_str()) {
                    continue;
                }
            }
            if emitted == max {
                page.next_page_token = last;
                return Ok(page);
            }
            match rolled {
                Some(p) => {
                    if page.prefixes.last() != Some(&p) {
                        page.prefixes.push(p.clone());
                        emitted += 1;
                        last = Some(p);
                    }
                }
                None => {
                    page.objects.push(stored.meta.clone());
                    emitted += 1;
                    last = Some(key.clone());
                }
            }
        }
        Ok(page)
    }

    async fn get_range(
        &self,
        key: &str,
        generation: i64,
        range: Range<u64>,
    ) -> StoreResult<ByteStream> {
        self.counts.get.fetch_add(1, Ordering::SeqCst);
        self.injected_failure()?;
        let objects = self.objects.lock();
        let stored = objects
            .get(key)
            .filter(|s| s.meta.generation == generation)
            .ok_or_else(|| StoreError::not_found(key))?;
        let len = stored.data.len() as u64;
        if range.start > range.end || (range.start >= len && len > 0) {
            return Err(StoreError::new(
                StoreErrorKind::InvalidArgument,
                "range not satisfiable",
            ));
        }
        let data = stored
            .data
            .slice(range.start as usize..range.end.min(len) as usize);
        // Deliver in several pieces, as a network stream would.
        let pieces: Vec<StoreResult<Bytes>> = (0..data.len())
            .step_by(64 * 1024)
            .map(|i| Ok(data.slice(i..(i + 64 * 1024).min(data.len()))))
            .collect();
        Ok(Box::pin(futures::stream::iter(pieces)))
    }

    async fn put(
        &self,
        key: &str,
        data: Bytes,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta> {
        self.counts.write.fetch_add(1, Ordering::SeqCst);
        self.injected_failure()?;
        self.commit(key, data, pre, opts)
    }

    async fn start_resumable(
        &self,
        key: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ResumableSession> {
        self.counts.write.fetch_add(1, Ordering::SeqCst);
        self.injected_failure()?;
        let url = format!(
            "memory://upload/{}",
            self.next_generation.fetch_add(1, Ordering::SeqCst)
        );
        self.uploads.lock().insert(
            url.clone(),
            Upload {
                key: key.to_string(),
                pre,
                opts: opts.clone(),
                data: Vec::new(),
            },
        );
        Ok(ResumableSession {
            key: key.to_string(),
            url,
        })
    }

    async fn upload_chunk(
        &self,
        session: &ResumableSession,
        offset: u64,
        data: Bytes,
        total: Option<u64>,
    ) -> StoreResult<ChunkOutcome> {
        self.counts.write.fetch_add(1, Ordering::SeqCst);
        self.injected_failure()?;
        let mut uploads = self.uploads.lock();
        let up = uploads
            .get_mut(&session.url)
            .ok_or_else(|| StoreError::new(StoreErrorKind::NotFound, "no such upload session"))?;
        if offset != up.data.len() as u64 {
            return Ok(ChunkOutcome::Incomplete {
                persisted: up.data.len() as u64,
            });
        }
        if total.is_none() && !data.len().is_multiple_of(256 * 1024) {
            return Err(StoreError::new(
                StoreErrorKind::InvalidArgument,
                "chunk not a multiple of 256 KiB",
            ));
        }
        up.data.extend_from_slice(&data);
        match total {
            Some(t) if t == up.data.len() as u64 => {
                let Some(up) = uploads.remove(&session.url) else {
                    return Err(StoreError::new(StoreErrorKind::Other, "upload vanished"));
                };
                drop(uploads);
                self.commit(&up.key, Bytes::from(up.data), up.pre, &up.opts)
                    .map(ChunkOutcome::Done)
            }
            Some(_) => Err(StoreError::new(
                StoreErrorKind::InvalidArgument,
                "size does not match total",
            )),
            None => Ok(ChunkOutcome::Incomplete {
                persisted: up.data.len() as u64,
            }),
        }
    }

    async fn compose(
        &self,
        sources: &[(String, i64)],
        dest: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta> {
        self.counts.write.fetch_add(1, Ordering::SeqCst);
        self.injected_failure()?;
        if sources.is_empty() || sources.len() > 32 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidArgument,
                "compose takes 1 to 32 sources",
            ));
        }
        let mut data = Vec::new();
        {
            let objects = self.objects.lock();
            for (key, generation) in sources {
                let s = objects
                    .get(key)
                    .filter(|s| s.meta.generation == *generation)
                    .ok_or_else(|| StoreError::not_found(key))?;
                data.extend_from_slice(&s.data);
            }
        }
        let opts = WriteOptions {
            crc32c: None,
            ..opts.clone()
        };
        self.commit(dest, Bytes::from(data), pre, &opts)
    }

    async fn copy(
        &self,
        src: &str,
        src_generation: i64,
        dest: &str,
        pre: Precondition,
    ) -> StoreResult<ObjectMeta> {
        self.counts.write.fetch_add(1, Ordering::SeqCst);
        self.injected_failure()?;
        let s = self
            .objects
            .lock()
            .get(src)
            .filter(|s| s.meta.generation == src_generation)
            .cloned()
            .ok_or_else(|| StoreError::not_found(src))?;
        let opts = WriteOptions {
            content_type: s.meta.content_type.clone(),
            metadata: s.meta.metadata.clone(),
            crc32c: None,
        };
        self.commit(dest, s.data, pre, &opts)
    }

    async fn delete(&self, key: &str, pre: Precondition) -> StoreResult<()> {
        self.counts.delete.fetch_add(1, Ordering::SeqCst);
        self.injected_failure()?;
        let mut objects = self.objects.lock();
        if !objects.contains_key(key) {
            return Err(StoreError::not_found(key));
        }
        Self::check(&objects, key, pre)?;
        objects.remove(key);
        Ok(())
    }

    async fn update_metadata(
        &self,
        key: &str,
        generation: i64,
        metadata: &HashMap<String, String>,
    ) -> StoreResult<ObjectMeta> {
        self.counts.write.fetch_add(1, Ordering::SeqCst);
        self.injected_failure()?;
        let mut objects = self.objects.lock();
        if !objects.contains_key(key) {
            return Err(StoreError::not_found(key));
        }
        Self::check(&objects, key, Precondition::GenerationMatch(generation))?;
        let stored = objects
            .get_mut(key)
            .ok_or_else(|| StoreError::not_found(key))?;
        stored.meta.metadata.extend(metadata.clone());
        stored.meta.metageneration += 1;
        stored.meta.updated = SystemTime::now();
        Ok(stored.meta.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::read_range;

    fn names(p: &ListPage) -> (Vec<String>, Vec<String>) {
        (
            p.objects.iter().map(|o| o.key.clone()).collect(),
            p.prefixes.clone(),
        )
    }

    #[tokio::test]
    async fn preconditions_follow_gcs() {
        let s = MemoryStore::new();
        let opts = WriteOptions::default();
        let a = s
            .put(
                "a",
                Bytes::from_static(b"1"),
                Precondition::DoesNotExist,
                &opts,
            )
            .await
            .unwrap();
        let e = s
            .put(
                "a",
                Bytes::from_static(b"2"),
                Precondition::DoesNotExist,
                &opts,
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::PreconditionFailed);
        let e = s
            .put(
                "a",
                Bytes::from_static(b"2"),
                Precondition::GenerationMatch(a.generation + 1),
                &opts,
            )
            .await;
        assert_eq!(e.unwrap_err().kind, StoreErrorKind::PreconditionFailed);
        let b = s
            .put(
                "a",
                Bytes::from_static(b"2"),
                Precondition::GenerationMatch(a.generation),
                &opts,
            )
            .await
            .unwrap();
        assert!(b.generation > a.generation);
        // The old generation is gone, as in a bucket without versioning.
        assert_eq!(
            s.get_range("a", a.generation, 0..1)
                .await
                .err()
                .unwrap()
                .kind,
            StoreErrorKind::NotFound
        );
        assert_eq!(
            read_range(&s, "a", b.generation, 0..1).await.unwrap(),
            Bytes::from_static(b"2")
        );
        let e = s
            .delete("a", Precondition::GenerationMatch(a.generation))
            .await
            .unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::PreconditionFailed);
        s.delete("a", Precondition::GenerationMatch(b.generation))
            .await
            .unwrap();
        assert!(s.object_bytes("a").is_none());
    }

    #[tokio::test]
    async fn delimited_listing_pages() {
        let s = MemoryStore::new();
        for k in ["d/a", "d/b/1", "d/b/2", "d/c", "d/e/x", "d/f", "e"] {
            s.insert(k, "x");
        }
        let mut req = ListRequest {
            prefix: "d/".into(),
            delimiter: Some("/".into()),
            max_results: Some(2),
            ..Default::default()
        };
        let mut all_objects = Vec::new();
        let mut all_prefixes = Vec::new();
        loop {
            let page = s.list(&req).await.unwrap();
            let (o, p) = names(&page);
            assert!(o.len() + p.len() <= 2);
            all_objects.extend(o);
            all_prefixes.extend(p);
            match page.next_page_token {
                Some(t) => req.page_token = Some(t),
                None => break,
            }
        }
        assert_eq!(all_objects, vec!["d/a", "d/c", "d/f"]);
        assert_eq!(all_prefixes, vec!["d/b/", "d/e/"]);
    }

    #[tokio::test]
    async fn resumable_and_compose() {
        let s = MemoryStore::new();
        let opts = WriteOptions::default();
        let sess = s
            .start_resumable("r", Precondition::DoesNotExist, &opts)
            .await
            .unwrap();
        let chunk = Bytes::from(vec![7u8; 256 * 1024]);
        assert!(s
            .upload_chunk(&sess, 0, Bytes::from_static(b"odd"), None)
            .await
            .is_err());
        let out = s.upload_chunk(&sess, 0, chunk.clone(), None).await.unwrap();
        assert!(matches!(out, ChunkOutcome::Incomplete { persisted } if persisted == 256 * 1024));
        let out = s
            .upload_chunk(
                &sess,
                256 * 1024,
                Bytes::from_static(b"end"),
                Some(256 * 1024 + 3),
            )
            .await
            .unwrap();
        let ChunkOutcome::Done(meta) = out else {
            panic!("upload should be done")
        };
        assert_eq!(meta.size, 256 * 1024 + 3);

        let p1 = s.insert("p1", "ab");
        let p2 = s.insert("p2", "cd");
        let c = s
            .compose(
                &[("p1".into(), p1.generation), ("p2".into(), p2.generation)],
                "c",
                Precondition::None,
                &opts,
            )
            .await
            .unwrap();
        assert_eq!(s.object_bytes("c").unwrap(), Bytes::from_static(b"abcd"));
        assert_eq!(c.crc32c, Some(crc32c::crc32c(b"abcd")));
        let cp = s
            .copy("c", c.generation, "c2", Precondition::DoesNotExist)
            .await
            .unwrap();
        assert_eq!(cp.size, 4);
    }

    #[tokio::test]
    async fn injected_failures_are_retried_by_read_range() {
        let s = MemoryStore::new();
        let m = s.insert("k", "hello");
        // The request fails: the store's own retries are all there is (MemoryStore has none),
        // read_range does not multiply them.
        s.fail_next(2);
        assert!(read_range(&s, "k", m.generation, 1..4).await.is_err());
        assert_eq!(s.counts.get.load(Ordering::SeqCst), 1);
        s.fail_next(0);
        assert_eq!(
            read_range(&s, "k", m.generation, 1..4).await.unwrap(),
            Bytes::from_static(b"ell")
        );
    }
}
