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
//! generation for a modified one. A precondition failure is checked before it is believed: a
//! retried request whose first try landed (the answer was lost) also fails its precondition,
//! so the object is read back, and if its CRC32C and size are those of this version (or of an
//! earlier version of ours whose answer was lost) it is ours, not a conflict; an empty object
//! is ours only if it also names this mount as its writer (`WRITER_KEY`), since every empty
//! object has the same CRC32C and size. Only an object someone else wrote makes a conflict:
//! the bucket's object is left as it is and the local version is written beside it as
//! `NAME.conflict-<UTC timestamp>-<mount tag>`.
//!
//! **Never mixed.** The bytes of a version never change while it is uploaded (the write path
//! copies a version before editing it), and that is checked rather than trusted: every part's
//! CRC32C is computed from the bytes sent, parts saved by an earlier attempt are reused only if
//! the local bytes at their range still have their CRC32C, and the parts' CRCs combined must
//! equal the version's CRC32C before the compose that makes the object runs. Sources are pinned
//! by generation. A compose that finds a part missing starts the upload over.
//!
//! Progress (the session URL, the parts uploaded) is reported through a callback so the
//! journal can record it and a retry or a restarted mount can reuse it. Parts stay in the
//! bucket while the saved progress lists them, and are deleted once the object is made.

use std::fs::File;
use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use tracing::Instrument;

use super::journal::{PartRecord, UploadState};
use crate::buffer_pool::BufferPool;
use crate::store::{
    ChunkOutcome, ObjectMeta, ObjectStore, Precondition, StoreError, StoreErrorKind, StoreResult,
    WriteOptions, WRITER_KEY,
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

/// Bytes to upload: a read-only handle on a complete staging file, and the buffers its parts
/// are read into ([`BufferPool`]).
#[derive(Debug, Clone)]
pub struct UploadSource {
    file: Arc<File>,
    size: u64,
    buffers: Arc<BufferPool>,
}

impl UploadSource {
    pub fn new(file: File, size: u64, buffers: Arc<BufferPool>) -> Self {
        UploadSource {
            file: Arc::new(file),
            size,
            buffers,
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Reads `range` off the runtime's worker threads.
    pub async fn read(&self, range: Range<u64>) -> StoreResult<Bytes> {
        let (file, buffers) = (self.file.clone(), self.buffers.clone());
        crate::platform::blocking(move || buffers.read_at(&file, range))
            .await
            .map_err(|e| match e.kind() {
                // The file is shorter than the version: changed since its seal (a live
                // version the kernel writes), or cut short; as a CRC32C mismatch would say.
                std::io::ErrorKind::UnexpectedEof => {
                    changed_under_us("the file is shorter than the version")
                }
                _ => StoreError::new(StoreErrorKind::Other, format!("reading staged data: {e}")),
            })
    }
}

/// What to upload, and where.
#[derive(Debug, Clone)]
pub struct UploadJob {
    pub key: String,
    pub precondition: Precondition,
    pub opts: WriteOptions,
    /// CRC32C of the whole version.
    pub crc32c: u32,
    /// Where this upload's temporary parts go (ends in `/`).
    pub parts_prefix: String,
    /// (CRC32C, size) of earlier versions of ours that may have landed unseen.
    pub maybe_landed: Vec<(u32, u64)>,
    /// This mount's tag (its cache directory's), which ends the name of a conflict copy, so
    /// two mounts saving conflict copies of one name at the same second never collide.
    pub conflict_tag: String,
}

/// How an upload ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Uploaded(ObjectMeta),
    /// The precondition failed: the bucket's object was kept, and ours saved as this object.
    Conflict(ObjectMeta),
    /// The precondition failed because an earlier upload of ours landed although its answer
    /// was lost: the object is ours. Upload again on top of this generation.
    Rebased(ObjectMeta),
}

/// The conflict copy's name for `key` made at time `now` by the mount tagged `tag`:
/// `KEY.conflict-20261129T231500Z-<tag>`.
pub fn conflict_key(key: &str, now: SystemTime, tag: &str) -> String {
    let stamp = humantime::format_rfc3339_seconds(now)
        .to_string()
        .replace(['-', ':'], "");
    format!("{key}.conflict-{stamp}-{tag}")
}

/// The error of an upload whose local bytes do not match the version's CRC32C.
fn changed_under_us(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Other,
        format!("the staged bytes do not match the version being uploaded ({what}); starting over"),
    )
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
    upload_in_span(store, src, job, cfg, &opts, resume, on_progress)
        .instrument(span)
        .await
}

async fn upload_in_span<S: ObjectStore + ?Sized>(
    store: &S,
    src: &UploadSource,
    job: &UploadJob,
    cfg: &UploadConfig,
    opts: &WriteOptions,
    resume: &UploadState,
    on_progress: &(dyn Fn(UploadState) + Sync),
) -> StoreResult<Outcome> {
    if src.size() < cfg.single_shot_threshold {
        let data = src.read(0..src.size()).await?;
        if crc32c::crc32c(&data) != job.crc32c {
            return Err(changed_under_us("single request"));
        }
        return finalize(store, job, src.size(), |key, pre| {
            let data = data.clone();
            async move { store.put(&key, data, pre, opts).await }
        })
        .await;
    }
    match cfg.mode {
        UploadMode::Composite => {
            upload_composite(store, src, job, cfg, opts, resume, on_progress).await
        }
        UploadMode::Resumable => {
            if crc_of(src, 0..src.size()).await? != job.crc32c {
                return Err(changed_under_us("resumable"));
            }
            let session = match resume {
                UploadState::Uploading {
                    session_url: Some(url),
                    ..
                } => Some(url.clone()),
                _ => None,
            };
            finalize(store, job, src.size(), |key, pre| {
                // A saved session belongs to the object's own name and precondition.
                let session = session.clone().filter(|_| key == job.key);
                async move {
                    upload_resumable(store, src, &key, pre, cfg, opts, session, on_progress).await
                }
            })
            .await
        }
    }
}

/// Makes the object with `write(key, precondition)`, and sorts out a precondition failure:
/// our own earlier write (its answer lost), or someone else's (a conflict copy is saved).
async fn finalize<S, F, Fut>(
    store: &S,
    job: &UploadJob,
    size: u64,
    write: F,
) -> StoreResult<Outcome>
where
    S: ObjectStore + ?Sized,
    F: Fn(String, Precondition) -> Fut,
    Fut: std::future::Future<Output = StoreResult<ObjectMeta>>,
{
    // Every empty object has the same CRC32C and size: an empty one is ours only if it names
    // this mount as its writer, as our empty uploads do (another machine's claim, or its own
    // empty file, is not a lost answer of ours). The mount's tag, not this job's metadata: a
    // non-empty version carries no writer, yet an empty earlier one of ours may have landed.
    let is = |m: &ObjectMeta, crc: u32, len: u64| {
        m.crc32c == Some(crc)
            && m.size == len
            && (len > 0
                || (!job.conflict_tag.is_empty()
                    && m.metadata.get(WRITER_KEY) == Some(&job.conflict_tag)))
    };
    let err = match write(job.key.clone(), job.precondition).await {
        // The object made must be this version (a resumed session may answer with the object
        // an earlier version of ours finished).
        Ok(meta) if meta.size == size && meta.crc32c.is_none_or(|c| c == job.crc32c) => {
            return Ok(Outcome::Uploaded(meta))
        }
        Ok(meta) if job.maybe_landed.iter().any(|&(c, l)| is(&meta, c, l)) => {
            return Ok(Outcome::Rebased(meta))
        }
        Ok(meta) => {
            return Err(StoreError::new(
                StoreErrorKind::Other,
                format!(
                    "the bucket made {} with {} bytes, not the {size} bytes uploaded",
                    meta.key, meta.size
                ),
            ))
        }
        Err(e) if e.kind == StoreErrorKind::PreconditionFailed => e,
        Err(e) => return Err(e),
    };
    match store.head(&job.key).await {
        Ok(m) if is(&m, job.crc32c, size) => {
            tracing::info!(key = %job.key, "precondition failed on our own earlier write (its answer was lost): already uploaded");
            return Ok(Outcome::Uploaded(m));
        }
        Ok(m) if job.maybe_landed.iter().any(|&(c, l)| is(&m, c, l)) => {
            tracing::info!(key = %job.key, "the object is an earlier upload of ours whose answer was lost; uploading on top of it");
            return Ok(Outcome::Rebased(m));
        }
        Ok(_) => {}
        Err(e) if e.kind == StoreErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let saved_as = conflict_key(&job.key, crate::clock::now(), &job.conflict_tag);
    tracing::error!(
        key = %job.key,
        saved_as = %saved_as,
        error = %err,
        "the object changed in the bucket since it was opened: keeping the bucket's version, saving ours beside it"
    );
    match write(saved_as.clone(), Precondition::DoesNotExist).await {
        Ok(meta) => Ok(Outcome::Conflict(meta)),
        Err(e) if e.kind == StoreErrorKind::PreconditionFailed => match store.head(&saved_as).await
        {
            Ok(m) if is(&m, job.crc32c, size) => Ok(Outcome::Conflict(m)),
            _ => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// CRC32C of `range` of the source, read in blocks of at most 8 MiB.
async fn crc_of(src: &UploadSource, range: Range<u64>) -> StoreResult<u32> {
    let mut crc = 0u32;
    let mut pos = range.start;
    while pos < range.end {
        let end = (pos + (8 << 20)).min(range.end);
        crc = crc32c::crc32c_append(crc, &src.read(pos..end).await?);
        pos = end;
    }
    Ok(crc)
}

/// Part size for `size` bytes: at least the configured size, and large enough that the parts
/// never exceed 1,024 (which keeps the compose tree at most two levels deep).
fn part_size_for(size: u64, cfg: &UploadConfig) -> u64 {
    cfg.part_size.max(size.div_ceil(1024)).max(1)
}

/// Deletes temporary objects, as many at once as parts go up (one at a time, 32 deletes cost
/// as much as a part). What cannot be deleted is removed at the next mount.
pub(super) async fn delete_all<S: ObjectStore + ?Sized>(
    store: &S,
    keys: Vec<String>,
    concurrency: usize,
) {
    futures::stream::iter(keys)
        .for_each_concurrent(concurrency.max(1), |key| async move {
            if let Err(e) = store.delete(&key, Precondition::None).await {
                if e.kind != StoreErrorKind::NotFound {
                    tracing::warn!(key, error = %e, "could not delete a temporary part; it will be removed at the next mount");
                }
            }
        })
        .await;
}

/// Parts saved by an earlier attempt that still hold the local bytes of this version at their
/// range; the others are returned to be deleted.
async fn reusable_parts(
    src: &UploadSource,
    resume: &UploadState,
    part: u64,
) -> StoreResult<(Vec<PartRecord>, Vec<String>)> {
    let UploadState::Uploading { parts, .. } = resume else {
        return Ok((Vec::new(), Vec::new()));
    };
    let size = src.size();
    let mut keep: Vec<PartRecord> = Vec::new();
    let mut stale = Vec::new();
    for p in parts {
        let offset = u64::from(p.index) * part;
        let len = part.min(size.saturating_sub(offset));
        let fits = p.offset == offset
            && p.len == len
            && len > 0
            && !keep.iter().any(|k| k.index == p.index);
        if fits && crc_of(src, offset..offset + len).await? == p.crc32c {
            keep.push(p.clone());
        } else {
            stale.push(p.key.clone());
        }
    }
    Ok((keep, stale))
}

async fn upload_composite<S: ObjectStore + ?Sized>(
    store: &S,
    src: &UploadSource,
    job: &UploadJob,
    cfg: &UploadConfig,
    opts: &WriteOptions,
    resume: &UploadState,
    on_progress: &(dyn Fn(UploadState) + Sync),
) -> StoreResult<Outcome> {
    let size = src.size();
    let part = part_size_for(size, cfg);
    let count = size.div_ceil(part) as u32;
    let report = |parts: Vec<PartRecord>| {
        on_progress(UploadState::Uploading {
            session_url: None,
            parts,
        })
    };
    let (reused, stale) = reusable_parts(src, resume, part).await?;
    if !stale.is_empty() {
        tracing::info!(
            count = stale.len(),
            "saved parts belong to another version; uploading them again"
        );
        report(reused.clone());
        delete_all(store, stale, cfg.concurrency).await;
    }
    let done: Mutex<Vec<PartRecord>> = Mutex::new(reused);
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
            let done = &done;
            async move {
                let offset = u64::from(i) * part;
                let range = offset..(offset + part).min(size);
                let data = src.read(range.clone()).await?;
                let crc = crc32c::crc32c(&data);
                let key = format!("{}{i:05}", job.parts_prefix);
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
                        offset,
                        len: range.end - range.start,
                    });
                    d.clone()
                };
                report(snapshot);
                Ok::<_, StoreError>(())
            }
        })
        .buffer_unordered(cfg.concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;

    let mut parts = done.into_inner();
    parts.sort_by_key(|p| p.index);
    let part_keys: Vec<String> = parts.iter().map(|p| p.key.clone()).collect();
    // Every part belongs to this version, or nothing is composed.
    let combined = parts.iter().fold(0u32, |crc, p| {
        crc32c::crc32c_combine(crc, p.crc32c, p.len as usize)
    });
    if combined != job.crc32c {
        report(Vec::new());
        delete_all(store, part_keys, cfg.concurrency).await;
        return Err(changed_under_us("parts"));
    }
    let mut intermediates = Vec::new();
    let result = async {
        let mut sources: Vec<(String, i64)> = parts
            .iter()
            .map(|p| (p.key.clone(), p.generation))
            .collect();
        let mut level = 0;
        while sources.len() > MAX_COMPOSE_SOURCES {
            let mut next = Vec::new();
            for (n, group) in sources.chunks(MAX_COMPOSE_SOURCES).enumerate() {
                let key = format!("{}c{level}-{n:05}", job.parts_prefix);
                let meta = store
                    .compose(group, &key, Precondition::None, &WriteOptions::default())
                    .await?;
                intermediates.push(key.clone());
                next.push((key, meta.generation));
            }
            sources = next;
            level += 1;
        }
        let final_opts = WriteOptions {
            crc32c: None,
            ..opts.clone()
        };
        finalize(store, job, size, |key, pre| {
            let (sources, final_opts) = (&sources, &final_opts);
            async move { store.compose(sources, &key, pre, final_opts).await }
        })
        .await
    }
    .await;
    let mut garbage = intermediates;
    match &result {
        Ok(_) => garbage.extend(part_keys),
        Err(e) if e.kind == StoreErrorKind::NotFound => {
            // A part is gone (deleted by hand, or expired): start over rather than retry a
            // compose that can never succeed.
            tracing::warn!(error = %e, "a part of the upload is missing; starting over");
            report(Vec::new());
            garbage.extend(part_keys);
        }
        // Parts stay, listed in the saved progress, for the next attempt.
        Err(_) => {}
    }
    delete_all(store, garbage, cfg.concurrency).await;
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
    session_url: Option<String>,
    on_progress: &(dyn Fn(UploadState) + Sync),
) -> StoreResult<ObjectMeta> {
    let size = src.size();
    let chunk = (cfg.chunk_size / CHUNK_GRANULE).max(1) * CHUNK_GRANULE;
    let resumed = session_url.map(|url| crate::store::ResumableSession {
        key: key.to_string(),
        url,
    });
    let (session, mut offset) = match resumed {
        Some(s) => match store.upload_chunk(&s, 0, Bytes::new(), None).await {
            Ok(ChunkOutcome::Incomplete { persisted }) => (s, persisted),
            // Finished already; `finalize` checks the object is this version.
            Ok(ChunkOutcome::Done(meta)) => return Ok(meta),
            // Gone, expired (410) or refused: a new session. Only a passing failure is retried
            // on the same one.
            Err(e) if !e.is_retryable() => (store.start_resumable(key, pre, opts).await?, 0),
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
