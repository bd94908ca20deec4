//! Uploading a staged file: single-shot, parallel composite, or resumable.
//!
//! - Under the single-shot threshold (16 MiB by default): one request carrying the CRC32C. A
//!   resumable session would cost an extra round trip for no gain at this size.
//! - Otherwise, by default, a parallel composite upload: parts of at least the part size are
//!   uploaded concurrently as temporary objects under a reserved prefix, composed into the final
//!   object (in a tree when there are more than 32), checked against the local CRC32C, and
//!   deleted.
//! - Or, with `UploadMode::Resumable`, one resumable session sending 8 MiB chunks, each a
//!   multiple of 256 KiB except the last.
//!
//! Every final write carries a precondition: `ifGenerationMatch=0` for a new file, the opened
//! generation for a modified one. When it fails, the bucket's object is left as it is and the
//! local version is written beside it as `NAME.conflict-<UTC timestamp>`. Progress (the session
//! URL, the parts uploaded) is reported through a callback so the journal can record it and a
//! restarted mount can reuse it.

use std::fs::File;
use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;

use super::journal::{PartRecord, UploadState};
use crate::store::{
    ChunkOutcome, ObjectMeta, ObjectStore, Precondition, StoreError, StoreErrorKind, StoreResult,
    WriteOptions,
};

/// GCS composes at most this many sources in one request.
pub const MAX_COMPOSE_SOURCES: usize = 32;
/// Resumable chunks must be multiples of this, except the last.
pub const CHUNK_GRANULE: u64 = 256 * 1024;

/// How big files are uploaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadMode {
    Composite,
    Resumable,
}

/// Upload tuning.
#[derive(Debug, Clone)]
pub struct UploadConfig {
    pub single_shot_threshold: u64,
    pub part_size: u64,
    pub concurrency: usize,
    pub mode: UploadMode,
    pub chunk_size: u64,
    /// Reserved prefix for temporary part objects, ending in `/`.
    pub temp_prefix: String,
}

impl Default for UploadConfig {
    fn default() -> Self {
        UploadConfig {
            single_shot_threshold: 16 << 20,
            part_size: 32 << 20,
            concurrency: 8,
            mode: UploadMode::Composite,
            chunk_size: 8 << 20,
            temp_prefix: ".bucketdrive-parts/".into(),
        }
    }
}

/// Bytes to upload: a read-only handle on a complete staging file.
#[derive(Debug, Clone)]
pub struct UploadSource {
    file: Arc<File>,
    size: u64,
}

impl UploadSource {
    pub fn new(file: File, size: u64) -> Self {
        UploadSource {
            file: Arc::new(file),
            size,
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Reads `range` off the runtime's worker threads.
    pub async fn read(&self, range: Range<u64>) -> StoreResult<Bytes> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; (range.end - range.start) as usize];
            crate::platform::read_exact_at(&file, &mut buf, range.start).map(|_| Bytes::from(buf))
        })
        .await
        .map_err(|e| StoreError::new(StoreErrorKind::Other, format!("read task failed: {e}")))?
        .map_err(|e| StoreError::new(StoreErrorKind::Other, format!("reading staged data: {e}")))
    }
}

/// What to upload, and where.
#[derive(Debug, Clone)]
pub struct UploadJob {
    /// Journal id, used to name temporary parts.
    pub id: u64,
    pub key: String,
    pub precondition: Precondition,
    pub opts: WriteOptions,
    /// CRC32C of the whole staged file.
    pub crc32c: u32,
}

/// How an upload ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Uploaded(ObjectMeta),
    /// The precondition failed: the bucket's object was kept, and ours saved as this object.
    Conflict(ObjectMeta),
}

/// The conflict copy's name for `key` at time `now`: `KEY.conflict-20261129T231500Z`.
pub fn conflict_key(key: &str, now: SystemTime) -> String {
    let stamp = humantime::format_rfc3339_seconds(now)
        .to_string()
        .replace(['-', ':'], "");
    format!("{key}.conflict-{stamp}")
}

/// Uploads `src` as `job` describes, reusing what `resume` says was already done, and reporting
/// progress to `on_progress`.
pub async fn upload<S: ObjectStore + ?Sized>(
    store: &S,
    src: &UploadSource,
    job: &UploadJob,
    cfg: &UploadConfig,
    resume: &UploadState,
    on_progress: &(dyn Fn(UploadState) + Sync),
) -> StoreResult<Outcome> {
    let opts = WriteOptions {
        crc32c: Some(job.crc32c),
        ..job.opts.clone()
    };
    let span = tracing::info_span!("upload", key = %job.key, size = src.size());
    let _enter = span.enter();
    match upload_to(store, src, job, cfg, &opts, resume, on_progress).await {
        Ok(meta) => Ok(Outcome::Uploaded(meta)),
        Err(e) if e.kind == StoreErrorKind::PreconditionFailed => {
            let saved_as = conflict_key(&job.key, SystemTime::now());
            tracing::error!(
                key = %job.key,
                saved_as = %saved_as,
                "the object changed in the bucket since it was opened: keeping the bucket's version, saving ours beside it"
            );
            let alt = UploadJob {
                key: saved_as,
                precondition: Precondition::DoesNotExist,
                ..job.clone()
            };
            let meta = upload_to(
                store,
                src,
                &alt,
                cfg,
                &opts,
                &UploadState::Staged,
                on_progress,
            )
            .await?;
            Ok(Outcome::Conflict(meta))
        }
        Err(e) => Err(e),
    }
}

/// Uploads with the strategy the size and mode call for.
async fn upload_to<S: ObjectStore + ?Sized>(
    store: &S,
    src: &UploadSource,
    job: &UploadJob,
    cfg: &UploadConfig,
    opts: &WriteOptions,
    resume: &UploadState,
    on_progress: &(dyn Fn(UploadState) + Sync),
) -> StoreResult<ObjectMeta> {
    if src.size() < cfg.single_shot_threshold {
        return upload_single(store, src, &job.key, job.precondition, opts).await;
    }
    match cfg.mode {
        UploadMode::Composite => {
            upload_composite(store, src, job, cfg, opts, resume, on_progress).await
        }
        UploadMode::Resumable => {
            upload_resumable(
                store,
                src,
                &job.key,
                job.precondition,
                cfg,
                opts,
                resume,
                on_progress,
            )
            .await
        }
    }
}

async fn upload_single<S: ObjectStore + ?Sized>(
    store: &S,
    src: &UploadSource,
    key: &str,
    pre: Precondition,
    opts: &WriteOptions,
) -> StoreResult<ObjectMeta> {
    let data = src.read(0..src.size()).await?;
    store.put(key, data, pre, opts).await
}

/// Part size for `size` bytes: at least the configured size, and large enough that the parts
/// never exceed 1,024 (which keeps the compose tree at most two levels deep).
fn part_size_for(size: u64, cfg: &UploadConfig) -> u64 {
    cfg.part_size.max(size.div_ceil(1024)).max(1)
}

async fn upload_composite<S: ObjectStore + ?Sized>(
    store: &S,
    src: &UploadSource,
    job: &UploadJob,
    cfg: &UploadConfig,
    opts: &WriteOptions,
    resume: &UploadState,
    on_progress: &(dyn Fn(UploadState) + Sync),
) -> StoreResult<ObjectMeta> {
    let size = src.size();
    let part = part_size_for(size, cfg);
    let count = size.div_ceil(part) as u32;
    let prefix = format!(
        "{}{:016x}-{}/",
        cfg.temp_prefix,
        job.id,
        crc32c::crc32c(job.key.as_bytes())
    );
    let done: Mutex<Vec<PartRecord>> = Mutex::new(match resume {
        UploadState::Uploading { parts, .. } => parts
            .iter()
            .filter(|p| p.index < count && p.key.starts_with(&prefix))
            .cloned()
            .collect(),
        _ => Vec::new(),
    });
    let todo: Vec<u32> = (0..count)
        .filter(|i| !done.lock().iter().any(|p| p.index == *i))
        .collect();
    tracing::debug!(
        parts = count,
        reused = count as usize - todo.len(),
        part_size = part,
        "composite upload"
    );

    futures::stream::iter(todo)
        .map(|i| {
            let prefix = &prefix;
            let done = &done;
            async move {
                let range = u64::from(i) * part..(u64::from(i + 1) * part).min(size);
                let data = src.read(range).await?;
                let crc = crc32c::crc32c(&data);
                let key = format!("{prefix}{i:05}");
                let part_opts = WriteOptions {
                    crc32c: Some(crc),
                    ..Default::default()
                };
                let meta = store
                    .put(&key, data, Precondition::None, &part_opts)
                    .await?;
                let snapshot = {
                    let mut d = done.lock();
                    d.push(PartRecord {
                        index: i,
                        key,
                        generation: meta.generation,
                        crc32c: crc,
                    });
                    d.clone()
                };
                on_progress(UploadState::Uploading {
                    session_url: None,
                    parts: snapshot,
                });
                Ok::<_, StoreError>(())
            }
        })
        .buffer_unordered(cfg.concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;

    let mut parts = done.into_inner();
    parts.sort_by_key(|p| p.index);
    let mut temps: Vec<String> = parts.iter().map(|p| p.key.clone()).collect();
    let mut sources: Vec<(String, i64)> = parts
        .iter()
        .map(|p| (p.key.clone(), p.generation))
        .collect();
    let mut level = 0;
    while sources.len() > MAX_COMPOSE_SOURCES {
        let mut next = Vec::new();
        for (n, group) in sources.chunks(MAX_COMPOSE_SOURCES).enumerate() {
            let key = format!("{prefix}c{level}-{n:05}");
            let meta = store
                .compose(group, &key, Precondition::None, &WriteOptions::default())
                .await?;
            temps.push(key.clone());
            next.push((key, meta.generation));
        }
        sources = next;
        level += 1;
    }
    let final_opts = WriteOptions {
        crc32c: None,
        ..opts.clone()
    };
    let result = store
        .compose(&sources, &job.key, job.precondition, &final_opts)
        .await;
    let result = match result {
        Ok(meta) if meta.crc32c.is_some_and(|c| c != job.crc32c) => Err(StoreError::new(
            StoreErrorKind::Other,
            format!(
                "composed object {} has a different CRC32C than the staged file",
                job.key
            ),
        )),
        other => other,
    };
    // Temporaries go whatever happened (a failed upload starts its parts again), as many at
    // once as parts went up: one at a time, 32 deletes cost as much as a part.
    futures::stream::iter(temps)
        .for_each_concurrent(cfg.concurrency.max(1), |key| async move {
            if let Err(e) = store.delete(&key, Precondition::None).await {
                if e.kind != StoreErrorKind::NotFound {
                    tracing::warn!(key, error = %e, "could not delete a temporary part; it will be removed at the next mount");
                }
            }
        })
        .await;
    result
}

#[allow(clippy::too_many_arguments)]
async fn upload_resumable<S: ObjectStore + ?Sized>(
    store: &S,
    src: &UploadSource,
    key: &str,
    pre: Precondition,
    cfg: &UploadConfig,
    opts: &WriteOptions,
    resume: &UploadState,
    on_progress: &(dyn Fn(UploadState) + Sync),
) -> StoreResult<ObjectMeta> {
    let size = src.size();
    let chunk = (cfg.chunk_size / CHUNK_GRANULE).max(1) * CHUNK_GRANULE;
    let resumed = match resume {
        UploadState::Uploading {
            session_url: Some(url),
            ..
        } => Some(crate::store::ResumableSession {
            key: key.to_string(),
            url: url.clone(),
        }),
        _ => None,
    };
    let (session, mut offset) = match resumed {
        Some(s) => match store.upload_chunk(&s, 0, Bytes::new(), None).await {
            Ok(ChunkOutcome::Incomplete { persisted }) => (s, persisted),
            Ok(ChunkOutcome::Done(meta)) => return Ok(meta),
            Err(e) if e.kind == StoreErrorKind::NotFound => {
                (store.start_resumable(key, pre, opts).await?, 0)
            }
            Err(e) => return Err(e),
        },
        None => (store.start_resumable(key, pre, opts).await?, 0),
    };
    on_progress(UploadState::Uploading {
        session_url: Some(session.url.clone()),
        parts: Vec::new(),
    });
    loop {
        let end = (offset + chunk).min(size);
        let last = end == size;
        let data = src.read(offset..end).await?;
        match store
            .upload_chunk(&session, offset, data, last.then_some(size))
            .await?
        {
            ChunkOutcome::Done(meta) => return Ok(meta),
            ChunkOutcome::Incomplete { persisted } => {
                if last && persisted >= size {
                    return Err(StoreError::new(
                        StoreErrorKind::Transient,
                        "upload finished without an object",
                    ));
                }
                offset = persisted;
            }
        }
    }
}

#[cfg(test)]
mod tests;
