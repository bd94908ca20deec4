//! The filesystem as a user sees it: paths walked from the root, whole-file reads, and short
//! names for contents and statuses in the logs.

use fs_core::filesystem::OpenMode;
use fs_core::write::writeback::Status;
use fs_core::{FsError, FsResult, Ino, Kind, ROOT_INO};

use super::model::digest;
use super::Fs;

/// What the filesystem shows at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Obs {
    Missing,
    Dir,
    File(Vec<u8>),
    Failed(FsError),
}

impl std::fmt::Display for Obs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Obs::Missing => write!(f, "missing"),
            Obs::Dir => write!(f, "a directory"),
            Obs::File(d) => write!(f, "{}", show(d)),
            Obs::Failed(e) => write!(f, "error ({e})"),
        }
    }
}

/// A short name for some content: its length and a few hex digits of its hash.
pub fn show(data: &[u8]) -> String {
    let (len, h) = digest(data);
    format!("{len}B#{:04x}", h & 0xffff)
}

/// The write status without its wall-clock fields (the upload rate).
pub fn show_status(s: &Status) -> String {
    format!(
        "status: pending {} ({} bytes, {} unsaved, {} failing), uploading {}, uploaded {}, \
         conflicts {}, failed attempts {}, not saved {}",
        s.pending_files,
        s.pending_bytes,
        s.unsaved_files,
        s.failed_files,
        s.uploading_files,
        s.uploaded_files,
        s.conflicts,
        s.failures,
        s.held_files
    )
}

pub fn show_opt(data: Option<&[u8]>) -> String {
    data.map_or("none".to_string(), show)
}

pub fn outcome<T>(r: &FsResult<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("error: {e}"),
    }
}

pub async fn lookup_path(fs: &Fs, path: &str) -> FsResult<fs_core::Attr> {
    let mut ino = ROOT_INO;
    let mut attr = None;
    for part in path.split('/') {
        let a = fs.lookup(ino, part).await?;
        ino = a.ino;
        attr = Some(a);
    }
    attr.ok_or(FsError::NotFound)
}

pub async fn read_all(fs: &Fs, ino: Ino) -> FsResult<Vec<u8>> {
    let h = fs.open(ino, OpenMode::default()).await?;
    if let fs_core::filesystem::KernelIo::Passthrough(file) = &h.io {
        // The kernel reads the backing file itself.
        let read = (|| {
            let mut out = vec![0u8; file.metadata()?.len() as usize];
            fs_core::platform::read_exact_at(file, &mut out, 0)?;
            Ok::<_, std::io::Error>(out)
        })();
        fs.release(h.fh).await;
        return read.map_err(FsError::from);
    }
    let mut out = Vec::new();
    let result = loop {
        match fs.read(h.fh, out.len() as u64, 64 * 1024).await {
            Ok(b) if b.is_empty() => break Ok(()),
            Ok(b) => out.extend_from_slice(&b),
            Err(e) => break Err(e),
        }
    };
    fs.release(h.fh).await;
    result.map(|()| out)
}

/// Looks `path` up and reads it whole, as `cat` would; a stale answer is retried, as the
/// kernel does after `ESTALE`.
pub async fn observe(fs: &Fs, path: &str) -> Obs {
    let mut last = FsError::Stale;
    for _ in 0..3 {
        let attr = match lookup_path(fs, path).await {
            Ok(a) => a,
            Err(FsError::NotFound) | Err(FsError::NotDir) => return Obs::Missing,
            Err(e) => return Obs::Failed(e),
        };
        if attr.kind == Kind::Dir {
            return Obs::Dir;
        }
        match read_all(fs, attr.ino).await {
            Ok(d) => return Obs::File(d),
            Err(FsError::Stale) => last = FsError::Stale,
            Err(FsError::NotFound) => return Obs::Missing,
            Err(e) => return Obs::Failed(e),
        }
    }
    Obs::Failed(last)
}
