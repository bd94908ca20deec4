//! `MemoryStore`: an in-memory bucket that follows GCS's generation and precondition rules
//! exactly, for unit and property tests.
//!
//! The emulator ignores preconditions on media and resumable uploads and on reads, so logic that
//! depends on them is tested here. Like a bucket without versioning, only the live generation of
//! each name is kept: reading a replaced generation fails with `NotFound`.
//!
//! It also counts requests by kind and can inject faults, so tests can assert what reached the
//! "network" and simulations can run the filesystem over a flaky link:
//!
//! - [`MemoryStore::fail_next`]: the next `n` requests fail with a transient error.
//! - [`MemoryStore::set_faults`]: each request fails before its effect, or has its effect and then
//!   fails (a lost response: the bucket acted, the client never heard), or succeeds, and may be
//!   delayed before and after its effect (on tokio's clock, so a paused clock keeps it instant
//!   and reproducible). Each decision is a hash of the seed, the operation, the key and how many
//!   requests of that operation on that key came before, so it does not depend on how requests
//!   to other keys interleave.
//! - [`MemoryStore::lose_next_answers`]: the next `n` writes have their effect and then fail
//!   (a lost answer), whatever else is set; with [`MemoryStore::set_retry`] the retry then
//!   meets the first try's effect.
//! - [`MemoryStore::set_offline`]: every request fails before its effect (a dead link).
//! - [`MemoryStore::set_link`]: reads take the time a shaped link would give them (a latency,
//!   a per-stream rate, a total rate shared by the streams), on tokio's clock.
//!
//! Every effect is applied at one point under the lock, so a request whose future is dropped
//! part-way either happened whole or not at all.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

use super::retry::RetryPolicy;
use super::{
    ByteStream, ChunkOutcome, ListPage, ListRequest, ObjectMeta, ObjectStore, Precondition,
    ResumableSession, StoreError, StoreErrorKind, StoreResult, WriteOptions,
};

/// A link that reads pass through: see [`MemoryStore::set_link`].
#[derive(Debug, Clone, Copy)]
pub struct LinkModel {
    /// Before the first byte of each read.
    pub latency: Duration,
    /// Bytes per second one stream can carry.
    pub per_stream: f64,
    /// Bytes per second all streams together can carry.
    pub total: f64,
}

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
    /// Objects and prefixes returned by LIST requests, summed: what listings cost beyond their
    /// count, since one request may carry a thousand names.
    pub listed: AtomicU64,
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

/// Random faults for every request (see [`MemoryStore::set_faults`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    /// Decisions are a function of this seed and the request, nothing else.
    pub seed: u64,
    /// Probability that a request fails with a transient error before having any effect.
    pub fail_before: f64,
    /// Probability that a request has its effect and then fails with a transient error.
    pub fail_after: f64,
    /// Each request waits a random `0..=max_delay` before its effect and again after it
    /// (`tokio::time::sleep`); concurrent requests are reordered by it.
    pub max_delay: Duration,
}

impl FaultConfig {
    /// No failures, only delays.
    pub fn delays(seed: u64, max_delay: Duration) -> Self {
        FaultConfig {
            seed,
            fail_before: 0.0,
            fail_after: 0.0,
            max_delay,
        }
    }
}

#[derive(Debug, Default)]
struct Faults {
    config: Option<FaultConfig>,
    offline: bool,
    /// Requests seen so far per (operation, key): the index of the next decision for it.
    seen: HashMap<(&'static str, String), u64>,
}

/// What happens to one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Plan {
    delay_before: Duration,
    fail_before: bool,
    delay_after: Duration,
    fail_after: bool,
}

impl Plan {
    fn decide(cfg: &FaultConfig, op: &str, key: &str, n: u64) -> Plan {
        // FNV-1a over the operation and key, then splitmix64 with the seed and the index.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in op.bytes().chain([0xff]).chain(key.bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let base = mix(mix(cfg.seed ^ h) ^ n);
        let unit = |salt: u64| (mix(base ^ salt) >> 11) as f64 / (1u64 << 53) as f64;
        let max_us = cfg.max_delay.as_micros() as u64;
        let delay = |salt: u64| Duration::from_micros(mix(base ^ salt) % (max_us + 1));
        let u = unit(1);
        Plan {
            delay_before: delay(2),
            fail_before: u < cfg.fail_before,
            delay_after: delay(3),
            fail_after: u >= cfg.fail_before && u < cfg.fail_before + cfg.fail_after,
        }
    }
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn transient(message: &str) -> StoreError {
    StoreError::new(StoreErrorKind::Transient, message)
}

/// An in-memory bucket.
#[derive(Debug, Default)]
pub struct MemoryStore {
    objects: Mutex<BTreeMap<String, Stored>>,
    uploads: Mutex<HashMap<String, Upload>>,
    next_generation: AtomicI64,
    /// The next this-many requests fail with a transient error.
    fail_next: AtomicU64,
    faults: Mutex<Faults>,
    /// Retries of transient failures, as `GcsStore` makes them per request (`None`: none).
    retry: Mutex<Option<RetryPolicy>>,
    /// Resumable sessions that made their object, and the object.
    finished: Mutex<HashMap<String, ObjectMeta>>,
    /// The next this-many last chunks of resumable uploads land, then lose their answer.
    lose_final_answers: AtomicU64,
    /// The next this-many writes (of any kind) land, then lose their answer.
    lose_next_answers: AtomicU64,
    /// Requests (operation, key) that fail once with a transient error before any effect.
    fail_on: Mutex<Vec<(&'static str, String)>>,
    link: Mutex<Option<LinkModel>>,
    /// Reads passing through the link now.
    streams: AtomicU64,
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

    /// Makes the next `n` resumable uploads finish their object and then lose the answer to
    /// their last chunk (a later query of the session answers with the object, as GCS does).
    pub fn lose_final_answers(&self, n: u64) {
        self.lose_final_answers.store(n, Ordering::SeqCst);
    }

    /// Makes the next `n` writes (puts, composes, copies, deletes, metadata patches, resumable
    /// requests) have their effect and then fail with a transient error: the answer is lost.
    /// A write that fails for another reason (a precondition, say) does not use one up.
    pub fn lose_next_answers(&self, n: u64) {
        self.lose_next_answers.store(n, Ordering::SeqCst);
    }

    /// Makes every later read take the time `link` gives it: its latency, then its bytes at
    /// the per-stream rate or an even share of the total, whichever is lower, as counted when
    /// the read starts (`None`: instant).
    pub fn set_link(&self, link: Option<LinkModel>) {
        *self.link.lock() = link;
    }

    /// Makes the next `n` requests fail with a transient error.
    pub fn fail_next(&self, n: u64) {
        self.fail_next.store(n, Ordering::SeqCst);
    }

    /// Makes the next `op` request ("copy", "delete", …) on `key` fail with a transient error
    /// before it has any effect: one failure placed exactly, where [`Self::fail_next`] counts
    /// requests.
    pub fn fail_next_on(&self, op: &'static str, key: &str) {
        self.fail_on.lock().push((op, key.to_string()));
    }

    /// Injects random faults and delays into every request from now on (`None`: none).
    pub fn set_faults(&self, config: Option<FaultConfig>) {
        self.faults.lock().config = config;
    }

    /// The faults in effect.
    pub fn faults(&self) -> Option<FaultConfig> {
        self.faults.lock().config
    }

    /// Retries every request's transient failures with `policy`, as `GcsStore` does, so the
    /// core sees what it sees in production: a lost answer followed by a retry that finds its
    /// own effect (a precondition failure, a missing object). `None` (the default): every
    /// failure reaches the caller.
    pub fn set_retry(&self, policy: Option<RetryPolicy>) {
        *self.retry.lock() = policy;
    }

    async fn retried<T, F, Fut>(&self, op: &'static str, key: &str, f: F) -> StoreResult<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = StoreResult<T>>,
    {
        let policy = *self.retry.lock();
        match policy {
            Some(p) => super::retry::with_retry(p, op, key, f).await,
            None => {
                let mut f = f;
                f().await
            }
        }
    }

    /// Takes the link down (`true`): every request fails with a transient error before having
    /// any effect. Requests are still counted.
    pub fn set_offline(&self, offline: bool) {
        self.faults.lock().offline = offline;
    }

    pub fn is_offline(&self) -> bool {
        self.faults.lock().offline
    }

    /// The bytes of the live object `key`, if any.
    pub fn object_bytes(&self, key: &str) -> Option<Bytes> {
        self.objects.lock().get(key).map(|s| s.data.clone())
    }

    /// Deletes an object unconditionally, with no fault, delay or count; a test convenience
    /// (a writer outside the filesystem). Whether there was one.
    pub fn remove(&self, key: &str) -> bool {
        self.objects.lock().remove(key).is_some()
    }

    /// Every live object: its name, generation and bytes, in name order.
    pub fn objects(&self) -> Vec<(String, i64, Bytes)> {
        self.objects
            .lock()
            .iter()
            .map(|(k, s)| (k.clone(), s.meta.generation, s.data.clone()))
            .collect()
    }

    /// Names of all live objects, in order.
    pub fn keys(&self) -> Vec<String> {
        self.objects.lock().keys().cloned().collect()
    }

    /// The part of a request before its effect: `fail_next`, the link, the fault plan's first
    /// delay and failure. The request was counted already.
    async fn begin(&self, op: &'static str, key: &str) -> StoreResult<Plan> {
        let took = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let placed = {
            let mut on = self.fail_on.lock();
            on.iter()
                .position(|(o, k)| *o == op && k == key)
                .map(|i| on.remove(i))
                .is_some()
        };
        if took || placed {
            return Err(transient("injected transient failure"));
        }
        let plan = {
            let mut f = self.faults.lock();
            if f.offline {
                return Err(transient("injected: offline"));
            }
            match f.config {
                None => Plan::default(),
                Some(cfg) => {
                    let n = f.seen.entry((op, key.to_string())).or_insert(0);
                    let plan = Plan::decide(&cfg, op, key, *n);
                    *n += 1;
                    plan
                }
            }
        };
        if !plan.delay_before.is_zero() {
            tokio::time::sleep(plan.delay_before).await;
        }
        if plan.fail_before {
            return Err(transient("injected transient failure before the request"));
        }
        Ok(plan)
    }

    /// The part of a request after its effect: the second delay, and a lost response.
    async fn end<T>(&self, plan: Plan, result: StoreResult<T>) -> StoreResult<T> {
        if !plan.delay_after.is_zero() {
            tokio::time::sleep(plan.delay_after).await;
        }
        if plan.fail_after {
            return Err(transient("injected: the response was lost"));
        }
        result
    }

    /// [`Self::end`] for a write: a write that had its effect may lose its answer
    /// ([`Self::lose_next_answers`]).
    async fn end_write<T>(&self, plan: Plan, result: StoreResult<T>) -> StoreResult<T> {
        let lose = result.is_ok()
            && self
                .lose_next_answers
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        let result = self.end(plan, result).await;
        if lose && result.is_ok() {
            return Err(transient("injected: the write landed, its answer was lost"));
        }
        result
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
        self.commit_locked(&mut self.objects.lock(), key, data, pre, opts)
    }

    /// Writes an object into `objects`, which the caller holds locked.
    fn commit_locked(
        &self,
        objects: &mut BTreeMap<String, Stored>,
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
        Self::check(objects, key, pre)?;
        let meta = ObjectMeta {
            metadata_trimmed: false,
            key: key.to_string(),
            generation: self.next_generation.fetch_add(1, Ordering::SeqCst),
            metageneration: 1,
            size: data.len() as u64,
            crc32c: Some(crc),
            updated: crate::clock::now(),
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

/// One attempt of each request; the trait's methods retry these when [`MemoryStore::set_retry`]
/// asks for it.
impl MemoryStore {
    async fn once_head(&self, key: &str) -> StoreResult<ObjectMeta> {
        self.counts.head.fetch_add(1, Ordering::SeqCst);
        let plan = self.begin("head", key).await?;
        let result = self
            .objects
            .lock()
            .get(key)
            .map(|s| s.meta.clone())
            .ok_or_else(|| StoreError::not_found(key));
        self.end(plan, result).await
    }

    async fn once_list(&self, req: &ListRequest) -> StoreResult<ListPage> {
        self.counts.list.fetch_add(1, Ordering::SeqCst);
        let plan = self.begin("list", &req.prefix).await?;
        let page = Self::list_page(&self.objects.lock(), req);
        self.counts.listed.fetch_add(
            (page.objects.len() + page.prefixes.len()) as u64,
            Ordering::SeqCst,
        );
        self.end(plan, Ok(page)).await
    }

    async fn once_get_range(
        &self,
        key: &str,
        generation: i64,
        range: Range<u64>,
    ) -> StoreResult<ByteStream> {
        self.counts.get.fetch_add(1, Ordering::SeqCst);
        let plan = self.begin("get", key).await?;
        let result = Self::read(&self.objects.lock(), key, generation, range);
        let data = self.end(plan, result).await?;
        let link = *self.link.lock();
        if let Some(link) = link {
            /// Counts a read on the link until it ends or is dropped.
            struct OnLink<'a>(&'a AtomicU64);
            impl Drop for OnLink<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let streams = self.streams.fetch_add(1, Ordering::SeqCst) + 1;
            let _on_link = OnLink(&self.streams);
            let rate = link.per_stream.min(link.total / streams as f64);
            let transfer = Duration::from_secs_f64(data.len() as f64 / rate.max(1.0));
            tokio::time::sleep(link.latency + transfer).await;
        }
        // Deliver in several pieces, as a network stream would.
        let pieces: Vec<StoreResult<Bytes>> = (0..data.len())
            .step_by(64 * 1024)
            .map(|i| Ok(data.slice(i..(i + 64 * 1024).min(data.len()))))
            .collect();
        Ok(Box::pin(futures::stream::iter(pieces)))
    }

    async fn once_put(
        &self,
        key: &str,
        data: Bytes,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta> {
        self.counts.write.fetch_add(1, Ordering::SeqCst);
        let plan = self.begin("put", key).await?;
        let result = self.commit(key, data, pre, opts);
        self.end_write(plan, result).await
    }

    async fn once_start_resumable(
        &self,
        key: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ResumableSession> {
        self.counts.write.fetch_add(1, Ordering::SeqCst);
        let plan = self.begin("start_resumable", key).await?;
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
        let session = ResumableSession {
            key: key.to_string(),
            url,
        };
        self.end_write(plan, Ok(session)).await
    }

    async fn once_upload_chunk(
        &self,
        session: &ResumableSession,
        offset: u64,
        data: Bytes,
        total: Option<u64>,
    ) -> StoreResult<ChunkOutcome> {
        self.counts.write.fetch_add(1, Ordering::SeqCst);
        let plan = self.begin("upload_chunk", &session.key).await?;
        let result = self.chunk(session, offset, data, total);
        self.end_write(plan, result).await
    }

    async fn once_compose(
        &self,
        sources: &[(String, i64)],
        dest: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta> {
        self.counts.write.fetch_add(1, Ordering::SeqCst);
        let plan = self.begin("compose", dest).await?;
        let result = self.compose_now(sources, dest, pre, opts);
        self.end_write(plan, result).await
    }

    async fn once_copy(
        &self,
        src: &str,
        src_generation: i64,
        dest: &str,
        pre: Precondition,
        mark: Option<&str>,
    ) -> StoreResult<ObjectMeta> {
        self.counts.write.fetch_add(1, Ordering::SeqCst);
        let plan = self.begin("copy", dest).await?;
        let result = {
            let mut objects = self.objects.lock();
            match objects
                .get(src)
                .filter(|s| s.meta.generation == src_generation)
                .cloned()
            {
                None => Err(StoreError::not_found(src)),
                Some(s) => {
                    let mut opts = WriteOptions {
                        content_type: s.meta.content_type.clone(),
                        metadata: s.meta.metadata.clone(),
                        crc32c: None,
                    };
                    if let Some(token) = mark {
                        opts.metadata
                            .insert(super::RENAME_KEY.to_string(), token.to_string());
                    }
                    self.commit_locked(&mut objects, dest, s.data, pre, &opts)
                }
            }
        };
        self.end_write(plan, result).await
    }

    async fn once_delete(&self, key: &str, pre: Precondition) -> StoreResult<()> {
        self.counts.delete.fetch_add(1, Ordering::SeqCst);
        let plan = self.begin("delete", key).await?;
        let result = {
            let mut objects = self.objects.lock();
            if objects.contains_key(key) {
                Self::check(&objects, key, pre).map(|()| {
                    objects.remove(key);
                })
            } else {
                Err(StoreError::not_found(key))
            }
        };
        self.end_write(plan, result).await
    }

    async fn once_update_metadata(
        &self,
        key: &str,
        generation: i64,
        metadata: &HashMap<String, String>,
    ) -> StoreResult<ObjectMeta> {
        self.counts.write.fetch_add(1, Ordering::SeqCst);
        let plan = self.begin("update_metadata", key).await?;
        let result = {
            let mut objects = self.objects.lock();
            Self::check(&objects, key, Precondition::GenerationMatch(generation))
                .map_err(|e| match objects.contains_key(key) {
                    true => e,
                    false => StoreError::not_found(key),
                })
                .and_then(|()| {
                    let stored = objects
                        .get_mut(key)
                        .ok_or_else(|| StoreError::not_found(key))?;
                    stored.meta.metadata.extend(metadata.clone());
                    stored.meta.metageneration += 1;
                    stored.meta.updated = crate::clock::now();
                    Ok(stored.meta.clone())
                })
        };
        self.end_write(plan, result).await
    }
}

#[async_trait::async_trait]
impl ObjectStore for MemoryStore {
    async fn head(&self, key: &str) -> StoreResult<ObjectMeta> {
        self.retried("head", key, || self.once_head(key)).await
    }

    async fn list(&self, req: &ListRequest) -> StoreResult<ListPage> {
        self.retried("list", &req.prefix, || self.once_list(req))
            .await
    }

    async fn get_range(
        &self,
        key: &str,
        generation: i64,
        range: Range<u64>,
    ) -> StoreResult<ByteStream> {
        self.retried("get_range", key, || {
            self.once_get_range(key, generation, range.clone())
        })
        .await
    }

    async fn put(
        &self,
        key: &str,
        data: Bytes,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta> {
        self.retried("put", key, || self.once_put(key, data.clone(), pre, opts))
            .await
    }

    async fn start_resumable(
        &self,
        key: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ResumableSession> {
        self.retried("start_resumable", key, || {
            self.once_start_resumable(key, pre, opts)
        })
        .await
    }

    async fn upload_chunk(
        &self,
        session: &ResumableSession,
        offset: u64,
        data: Bytes,
        total: Option<u64>,
    ) -> StoreResult<ChunkOutcome> {
        self.retried("upload_chunk", &session.key, || {
            self.once_upload_chunk(session, offset, data.clone(), total)
        })
        .await
    }

    async fn compose(
        &self,
        sources: &[(String, i64)],
        dest: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta> {
        self.retried("compose", dest, || {
            self.once_compose(sources, dest, pre, opts)
        })
        .await
    }

    async fn copy(
        &self,
        src: &str,
        src_generation: i64,
        dest: &str,
        pre: Precondition,
        mark: Option<&str>,
    ) -> StoreResult<ObjectMeta> {
        self.retried("copy", dest, || {
            self.once_copy(src, src_generation, dest, pre, mark)
        })
        .await
    }

    async fn delete(&self, key: &str, pre: Precondition) -> StoreResult<()> {
        self.retried("delete", key, || self.once_delete(key, pre))
            .await
    }

    async fn update_metadata(
        &self,
        key: &str,
        generation: i64,
        metadata: &HashMap<String, String>,
    ) -> StoreResult<ObjectMeta> {
        self.retried("update_metadata", key, || {
            self.once_update_metadata(key, generation, metadata)
        })
        .await
    }
}

impl MemoryStore {
    /// One page of a listing of `objects`.
    fn list_page(objects: &BTreeMap<String, Stored>, req: &ListRequest) -> ListPage {
        let max = req.max_results.unwrap_or(1000).max(1) as usize;
        let mut page = ListPage::default();
        let mut emitted = 0;
        let mut last: Option<String> = None;
        let start = req.page_token.clone().unwrap_or_else(|| req.prefix.clone());
        for (key, stored) in objects.range(start..) {
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
                return page;
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
        page
    }

    /// Bytes `range` of generation `generation` of `key`.
    fn read(
        objects: &BTreeMap<String, Stored>,
        key: &str,
        generation: i64,
        range: Range<u64>,
    ) -> StoreResult<Bytes> {
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
        Ok(stored
            .data
            .slice(range.start as usize..range.end.min(len) as usize))
    }

    /// The effect of one resumable chunk; the last one creates the object, in the same step.
    fn chunk(
        &self,
        session: &ResumableSession,
        offset: u64,
        data: Bytes,
        total: Option<u64>,
    ) -> StoreResult<ChunkOutcome> {
        // As GCS does, a session that made its object answers any later request with it.
        if let Some(meta) = self.finished.lock().get(&session.url) {
            return Ok(ChunkOutcome::Done(meta.clone()));
        }
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
        match total {
            Some(t) if t == up.data.len() as u64 + data.len() as u64 => {
                let mut objects = self.objects.lock();
                let mut whole = std::mem::take(&mut up.data);
                whole.extend_from_slice(&data);
                let (key, pre, opts) = (up.key.clone(), up.pre, up.opts.clone());
                uploads.remove(&session.url);
                let meta =
                    self.commit_locked(&mut objects, &key, Bytes::from(whole), pre, &opts)?;
                self.finished
                    .lock()
                    .insert(session.url.clone(), meta.clone());
                let lose = self
                    .lose_final_answers
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
                if lose {
                    return Err(transient(
                        "injected: the last chunk landed, its answer was lost",
                    ));
                }
                Ok(ChunkOutcome::Done(meta))
            }
            Some(_) => Err(StoreError::new(
                StoreErrorKind::InvalidArgument,
                "size does not match total",
            )),
            None => {
                up.data.extend_from_slice(&data);
                Ok(ChunkOutcome::Incomplete {
                    persisted: up.data.len() as u64,
                })
            }
        }
    }

    /// The effect of a compose: sources read and destination written under one lock.
    fn compose_now(
        &self,
        sources: &[(String, i64)],
        dest: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta> {
        if sources.is_empty() || sources.len() > 32 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidArgument,
                "compose takes 1 to 32 sources",
            ));
        }
        let mut objects = self.objects.lock();
        let mut data = Vec::new();
        for (key, generation) in sources {
            let s = objects
                .get(key)
                .filter(|s| s.meta.generation == *generation)
                .ok_or_else(|| StoreError::not_found(key))?;
            data.extend_from_slice(&s.data);
        }
        let opts = WriteOptions {
            crc32c: None,
            ..opts.clone()
        };
        self.commit_locked(&mut objects, dest, Bytes::from(data), pre, &opts)
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
            .copy("c", c.generation, "c2", Precondition::DoesNotExist, None)
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

    fn faulty(seed: u64, fail_before: f64, fail_after: f64) -> FaultConfig {
        FaultConfig {
            seed,
            fail_before,
            fail_after,
            max_delay: Duration::ZERO,
        }
    }

    async fn put_ok(s: &MemoryStore, key: &str) -> Result<(), StoreErrorKind> {
        s.put(
            key,
            Bytes::from_static(b"x"),
            Precondition::None,
            &WriteOptions::default(),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.kind)
    }

    #[tokio::test]
    async fn fault_decisions_depend_only_on_seed_operation_key_and_count() {
        let cfg = faulty(42, 0.2, 0.1);
        let alone = MemoryStore::new();
        alone.set_faults(Some(cfg));
        let mixed = MemoryStore::new();
        mixed.set_faults(Some(cfg));
        let mut outcomes = (Vec::new(), Vec::new());
        for i in 0..200 {
            outcomes.0.push(put_ok(&alone, "x").await);
            // Other keys and other operations in between change nothing for "x".
            for _ in 0..(i % 3) {
                let _ = put_ok(&mixed, "y").await;
                let _ = mixed.head("x").await;
            }
            outcomes.1.push(put_ok(&mixed, "x").await);
        }
        assert_eq!(outcomes.0, outcomes.1);
        let failed = outcomes.0.iter().filter(|r| r.is_err()).count();
        assert!((30..=90).contains(&failed), "{failed} of 200 failed");
        assert!(outcomes
            .0
            .iter()
            .all(|r| matches!(r, Ok(()) | Err(StoreErrorKind::Transient))));

        // Another seed decides differently.
        let other = MemoryStore::new();
        other.set_faults(Some(faulty(43, 0.2, 0.1)));
        let mut theirs = Vec::new();
        for _ in 0..200 {
            theirs.push(put_ok(&other, "x").await);
        }
        assert_ne!(outcomes.0, theirs);
    }

    #[tokio::test]
    async fn fail_before_has_no_effect_and_fail_after_loses_only_the_response() {
        let s = MemoryStore::new();
        s.insert("old", "1");
        s.set_faults(Some(faulty(1, 1.0, 0.0)));
        assert_eq!(put_ok(&s, "k").await, Err(StoreErrorKind::Transient));
        let e = s.delete("old", Precondition::None).await.unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::Transient);
        assert!(s.object_bytes("k").is_none(), "no effect");
        assert!(s.object_bytes("old").is_some(), "no effect");
        assert_eq!(s.counts.write.load(Ordering::SeqCst), 1, "still counted");
        assert_eq!(s.counts.delete.load(Ordering::SeqCst), 1, "still counted");

        s.set_faults(Some(faulty(1, 0.0, 1.0)));
        assert_eq!(put_ok(&s, "k").await, Err(StoreErrorKind::Transient));
        assert_eq!(
            &s.object_bytes("k").unwrap()[..],
            b"x",
            "the write happened"
        );
        let e = s.delete("old", Precondition::None).await.unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::Transient);
        assert!(s.object_bytes("old").is_none(), "the delete happened");
        // A retry of a conditional write that did happen meets its own object.
        let m = s.head("k").await;
        assert_eq!(m.unwrap_err().kind, StoreErrorKind::Transient);
        s.set_faults(None);
        let e = s
            .put(
                "k",
                Bytes::from_static(b"y"),
                Precondition::DoesNotExist,
                &WriteOptions::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::PreconditionFailed);
        assert_eq!(put_ok(&s, "k").await, Ok(()));
    }

    #[tokio::test]
    async fn offline_fails_every_request_before_its_effect() {
        let s = MemoryStore::new();
        let m = s.insert("a", "hello");
        s.set_offline(true);
        assert!(s.is_offline());
        assert_eq!(put_ok(&s, "b").await, Err(StoreErrorKind::Transient));
        assert_eq!(
            s.head("a").await.unwrap_err().kind,
            StoreErrorKind::Transient
        );
        assert!(s.get_range("a", m.generation, 0..5).await.is_err());
        assert!(s.list(&ListRequest::default()).await.is_err());
        assert!(s.delete("a", Precondition::None).await.is_err());
        assert_eq!(s.counts.total(), 5, "every request is counted");
        assert_eq!(s.keys(), vec!["a"], "nothing happened");
        s.set_offline(false);
        assert_eq!(put_ok(&s, "b").await, Ok(()));
        assert_eq!(s.keys(), vec!["a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn delays_run_on_the_tokio_clock_and_effects_are_atomic() {
        let s = MemoryStore::new();
        let max = Duration::from_millis(10);
        s.set_faults(Some(FaultConfig::delays(7, max)));
        let start = tokio::time::Instant::now();
        for i in 0..20 {
            put_ok(&s, &format!("k{i}")).await.unwrap();
        }
        let took = start.elapsed();
        assert!(took > Duration::ZERO && took <= max * 2 * 20, "{took:?}");

        // A request dropped part-way either happened whole or not at all; with a delay on
        // each side of the effect, both happen.
        let (mut done, mut not_done) = (0, 0);
        for i in 0..40u64 {
            let p1 = s.insert(&format!("p{i}a"), "ab");
            let p2 = s.insert(&format!("p{i}b"), "cd");
            let dest = format!("c{i}");
            let sources = [
                (format!("p{i}a"), p1.generation),
                (format!("p{i}b"), p2.generation),
            ];
            let opts = WriteOptions::default();
            let compose = s.compose(&sources, &dest, Precondition::DoesNotExist, &opts);
            let cut = Duration::from_micros(i * 500);
            if tokio::time::timeout(cut, compose).await.is_err() {
                match s.object_bytes(&dest) {
                    Some(b) => {
                        assert_eq!(&b[..], b"abcd");
                        done += 1;
                    }
                    None => not_done += 1,
                }
            }
        }
        assert!(done > 0 && not_done > 0, "{done} done, {not_done} not");

        // Same seed, same delays.
        let again = MemoryStore::new();
        again.set_faults(Some(FaultConfig::delays(7, max)));
        let start = tokio::time::Instant::now();
        for i in 0..20 {
            put_ok(&again, &format!("k{i}")).await.unwrap();
        }
        assert_eq!(start.elapsed(), took);
    }
}
