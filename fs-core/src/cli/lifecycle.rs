//! The mount process's life apart from the kernel: connect to the bucket and build the
//! filesystem, answer control requests, and finish pending uploads at the end. Both binaries
//! run exactly this around their own adapter.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;

use super::options::CommonArgs;
use crate::config::MountConfig;
use crate::read::ReadCache;
use crate::store::gcs::GcsStore;
use crate::store::ObjectStore;
use crate::write::cache_dir::CacheRoot;
use crate::Filesystem;

/// A multi-threaded runtime for the mount.
pub fn runtime() -> Result<Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("bucketdrive")
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))
}

/// Connects to the bucket (a missing bucket or bad credentials is an error here, before
/// anything is mounted), builds the filesystem staging writes in `cache` (decided by
/// [`CommonArgs::cache_root`] before anything else used it), and replays what an earlier run
/// left staged there. `platform` adds the platform's own options to the configuration.
pub fn open_filesystem(
    rt: &Runtime,
    common: &CommonArgs,
    cache: &CacheRoot,
    bucket: &str,
    prefix: &str,
    platform: impl FnOnce(&mut MountConfig),
) -> Result<Arc<Filesystem<GcsStore>>, String> {
    for note in &cache.notes {
        tracing::warn!("{note}");
    }
    let opts = common.store.gcs_options()?;
    for note in &opts.notes {
        tracing::warn!("{note}");
    }
    tracing::info!(endpoint = %opts.endpoint, bucket = %bucket, prefix = %prefix, "connecting");
    crate::platform::raise_fd_limit();
    let store = rt
        .block_on(GcsStore::connect(bucket, &opts))
        .map_err(|e| e.message)?;
    rt.block_on(store.check_access())?;

    let mut cfg = common.mount_config(bucket, prefix);
    platform(&mut cfg);
    let read_cache = match common.read_cache_config(cache)? {
        Some(rc) => Some(ReadCache::open(&rc)?),
        None => None,
    };
    let store = Arc::new(store);
    let mut fs = match common.write_config(cache) {
        None => Filesystem::new(store, cfg),
        Some(w) => {
            tracing::info!(cache_dir = %w.cache_dir.display(), "staging writes");
            // The cache directory becomes this bucket's before anything is replayed (I11);
            // records without an owner are taken only as the start-up decision said.
            Filesystem::with_write_adopting(store, cfg, w, cache.adopt)?
        }
    };
    if let Some(rc) = read_cache {
        fs.set_read_cache(rc);
    }
    let fs = Arc::new(fs);
    let replayed = rt.block_on(fs.start())?;
    if replayed > 0 {
        tracing::info!(
            files = replayed,
            "uploading files left staged by an earlier run"
        );
    }
    Ok(fs)
}

/// The mount's side of the control channel: one request word in, the upload status out as
/// one JSON line. `status` only reports; `drain` also starts every pending upload now,
/// whatever its write-back delay; `skip-drain` leaves pending uploads staged at unmount.
#[derive(Default)]
pub struct Control {
    skip_drain: AtomicBool,
    draining: Arc<AtomicBool>,
}

/// The longest control request read, in bytes.
pub const CONTROL_REQUEST_MAX: u64 = 256;
/// How long a control connection may take to send its request.
pub const CONTROL_REQUEST_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Control {
    /// Whether `unmount --no-wait` asked to leave pending uploads staged.
    pub fn skip_drain(&self) -> bool {
        self.skip_drain.load(Ordering::SeqCst)
    }

    /// Serves one connection of the control channel: reads the request line, acts on it and
    /// writes the reply. Returns the request word, for requests the platform handles itself
    /// (`unmount` on Windows); `None` if the client went away first.
    pub async fn converse<S, C>(&self, fs: &Arc<Filesystem<S>>, channel: C) -> Option<String>
    where
        S: ObjectStore,
        C: tokio::io::AsyncRead + tokio::io::AsyncWrite,
    {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let (r, mut w) = tokio::io::split(channel);
        let mut line = String::new();
        // Requests are one short word: a peer may send no more than a line of this, and must
        // send it promptly, or it is dropped. Connections are the owner's only, but one that
        // never ends its line must not hold a task and a descriptor for ever.
        let mut reader = tokio::io::BufReader::new(r.take(CONTROL_REQUEST_MAX));
        tokio::time::timeout(CONTROL_REQUEST_WAIT, reader.read_line(&mut line))
            .await
            .ok()?
            .ok()?;
        if !line.ends_with('\n') {
            return None;
        }
        let reply = self.answer(fs, &line).await;
        let _ = w.write_all(reply.as_bytes()).await;
        Some(line.trim().to_string())
    }

    /// Acts on one request and returns the reply line.
    pub async fn answer<S: ObjectStore>(&self, fs: &Arc<Filesystem<S>>, request: &str) -> String {
        match request.trim() {
            "skip-drain" => self.skip_drain.store(true, Ordering::SeqCst),
            "drain" if !self.draining.swap(true, Ordering::SeqCst) => {
                let (fs, draining) = (fs.clone(), self.draining.clone());
                tokio::spawn(async move {
                    fs.drain(true).await;
                    draining.store(false, Ordering::SeqCst);
                });
            }
            _ => {}
        }
        let status = fs.write_status().await;
        let mut out = serde_json::to_string(&status).unwrap_or_else(|_| "{}".into());
        out.push('\n');
        out
    }
}

/// After the unmount: what readers fetched is written to the read cache, and pending uploads
/// finish before the process exits (unless `skip_drain`); whatever cannot be uploaded stays
/// journaled for the next mount.
pub fn finish<S: ObjectStore>(rt: Runtime, fs: &Filesystem<S>, skip_drain: bool) {
    finish_read_cache(fs);
    if !rt.block_on(fs.settle_releases()) {
        tracing::warn!(
            "releases still under way at unmount: files they close may stay staged for the next mount"
        );
    }
    let status = rt.block_on(fs.write_status());
    if skip_drain {
        tracing::info!(
            files = status.pending_files,
            bytes = status.pending_bytes,
            "unmounted without waiting: pending uploads stay staged for the next mount"
        );
        rt.shutdown_timeout(Duration::from_secs(1));
        return;
    }
    if status.pending_files > 0 {
        tracing::info!(
            files = status.pending_files,
            bytes = status.pending_bytes,
            "finishing pending uploads"
        );
    }
    let left = rt.block_on(fs.drain(true));
    if left > 0 {
        tracing::warn!(
            files = left,
            "uploads failed; the files stay staged and will be uploaded at the next mount"
        );
    }
    let held = rt.block_on(fs.write_status());
    if held.held_files > 0 {
        tracing::error!(
            files = held.held_files,
            bytes = held.held_bytes,
            "files whose last changes were not saved (a write to them or their last close failed) stay staged and are not uploaded; the bucket keeps their last whole version"
        );
    }
    rt.shutdown_timeout(Duration::from_secs(5));
}

/// Writes what readers fetched to the read cache before the process exits, so the next mount
/// finds it; gives up (keeping what is written) after a few seconds.
fn finish_read_cache<S: ObjectStore>(fs: &Filesystem<S>) {
    if !fs.flush_read_cache(Duration::from_secs(10)) {
        tracing::warn!(
            "the read cache could not be written in time; some of it will be fetched again"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn fs() -> Arc<Filesystem<MemoryStore>> {
        Arc::new(Filesystem::new(
            Arc::new(MemoryStore::new()),
            crate::config::MountConfig::new("bkt"),
        ))
    }

    /// A control request is one short line, sent promptly: an endless line or a silent peer
    /// is dropped instead of holding a task and a descriptor for ever.
    #[tokio::test(start_paused = true)]
    async fn a_control_connection_is_bounded_in_size_and_time() {
        let (fs, control) = (fs(), Control::default());
        let (mut peer, ours) = tokio::io::duplex(64 * 1024);
        peer.write_all(&[b'x'; 10_000]).await.unwrap();
        assert_eq!(control.converse(&fs, ours).await, None, "an endless line");

        let (_silent, ours) = tokio::io::duplex(1024);
        let started = tokio::time::Instant::now();
        assert_eq!(control.converse(&fs, ours).await, None, "a silent peer");
        assert!(started.elapsed() >= CONTROL_REQUEST_WAIT);

        let (mut peer, ours) = tokio::io::duplex(64 * 1024);
        peer.write_all(b"status\n").await.unwrap();
        assert_eq!(control.converse(&fs, ours).await.as_deref(), Some("status"));
        let mut reply = String::new();
        peer.read_to_string(&mut reply).await.unwrap();
        assert!(reply.starts_with('{') && reply.ends_with('\n'), "{reply}");
    }
}
