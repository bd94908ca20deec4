//! The cache directory of one mount: where staged data and the journal live, and which
//! bucket and prefix they belong to (I11).
//!
//! Layout: `lock` (held with an exclusive file lock for the life of the mount, so two mounts can never share
//! one directory), `staging/<id>.data`, `journal/journal.log`, `mount-id`, a random tag
//! made once per cache directory, and `owner` ([`MARKER`]), the bucket and prefix its records
//! belong to. Temporary part objects in the bucket are named under the tag, so a mount can
//! tell its own leftovers from another mount's in-flight work. Journal records carry only
//! object keys: the marker is what keeps a directory's records from being uploaded to another
//! bucket or prefix. It is written, durably, when a mount first locks the directory, before
//! anything is staged ([`CacheDir::claim`]); a directory whose marker names another owner, or
//! that holds records with no marker (an earlier version) or a damaged one, is never used for
//! uploads unless the user says those records are this mount's (`--adopt-staged`).
//! Directories are mode 0700 and files 0600: staged data is the user's data.
//!
//! Which directory is the root ([`CacheRoot`], decided once, before the mount starts, and
//! checked again by the marker once locked):
//!
//! - By default, one per bucket and prefix ([`Owner::dir_name`]) in `<user cache>/bucketdrive`
//!   ([`CacheRoot::default_in`]), not per mountpoint, so a mount finds what a crash left
//!   wherever it is mounted again. A second mount of the same bucket and prefix while the
//!   first runs takes the per-mountpoint directory earlier versions used; a later mount takes
//!   any directory of its owner that holds records and no live mount holds.
//! - A directory the user names with `--cache-dir` is not ours: it may be shared (`/tmp`), so
//!   its mode is never changed and the root is our own sub-directory [`SUBDIR`] inside it,
//!   or, when that belongs to another bucket or prefix, `SUBDIR/`[`Owner::dir_name`]
//!   ([`CacheRoot::in_user_dir`]): two buckets can use one `--cache-dir` in turn, each keeping
//!   its own pending files.
//!
//! Every directory we own is checked when opened: a real directory (not a symbolic link),
//! owned by the effective user, narrowed to 0700 through a descriptor, then held: the lock,
//! the tag, the marker, staging files and the journal are reached through the held root,
//! `staging/` and `journal/`, never by a path looked up again ([`platform::Dir`]).
//!
//! Earlier versions used a named directory itself as the root. One that still holds that
//! layout (`lock`, `staging/` and `journal/` directly in it: see `holds_earlier_layout`) is a
//! candidate used in place. The answer depends only on what the candidates hold, never on
//! whether [`SUBDIR`] exists (a detached mount may create it for its log before the cache
//! directory is opened), so it is the same at every start. Using it needs the directory to be
//! ours and writable by no one else; otherwise the mount is refused, since anyone could have
//! planted those files (and a marker) and skipping them would strand what was staged there.
//! It is refused too when two candidates hold records of this mount: one of them would be
//! ignored.

use crate::platform::{self, At, Dir, Open};
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An open, locked cache directory.
#[derive(Debug)]
pub struct CacheDir {
    root: Arc<Dir>,
    staging: Arc<Dir>,
    journal: Arc<Dir>,
    tag: String,
    _lock: File,
}

/// The name of staging file `id` in the staging directory.
pub fn staging_file_name(id: u64) -> String {
    format!("{id:016x}.data")
}

impl CacheDir {
    /// Creates (if needed) and locks `root`, a directory of ours. Fails with a clear message
    /// if another mount holds it, or if it is a symbolic link or someone else's.
    pub fn open(root: &Path) -> Result<Self, String> {
        Self::open_at(root, false)
    }

    /// Like [`Self::open`]; with `legacy`, `root` is a directory the user named that holds
    /// the earlier layout: used as it is, its own mode untouched.
    pub fn open_at(root: &Path, legacy: bool) -> Result<Self, String> {
        let fail = |p: &Path, e: std::io::Error| {
            format!("cannot use cache directory {}: {e}", p.display())
        };
        let dir = if legacy {
            tracing::info!(
                cache_dir = %root.display(),
                "the cache directory holds the layout of an earlier version; using it as it is"
            );
            Dir::as_is(root)
        } else {
            Dir::private(root)
        }
        .map_err(|e| fail(root, e))?;
        let staging = dir
            .child("staging")
            .map_err(|e| fail(&root.join("staging"), e))?;
        let journal = dir
            .child("journal")
            .map_err(|e| fail(&root.join("journal"), e))?;
        let lock_at = dir.at("lock");
        let lock = lock_at
            .open(Open::new().read(true).write(true).create(true))
            .map_err(|e| format!("cannot open {lock_at}: {e}"))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(format!(
                "cache directory {} is in use by another mount; give each mount its own --cache-dir",
                root.display()
            )),
            Err(TryLockError::Error(e)) => {
                return Err(format!("cannot lock cache directory {}: {e}", root.display()))
            }
        }
        let tag = mount_tag(&dir)?;
        Ok(CacheDir {
            root: dir,
            staging,
            journal,
            tag,
            _lock: lock,
        })
    }

    /// This cache directory's tag: names its temporary parts in the bucket.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Ids of every staging file present, and the paths of files that are not staging files
    /// of ours (left by a copy interrupted by a crash).
    pub fn staging_ids(&self) -> std::io::Result<(Vec<u64>, Vec<At>)> {
        let mut ids = Vec::new();
        let mut other = Vec::new();
        for name in self.staging.names()? {
            let Some(name) = name.to_str() else {
                // Not a name of ours, and not one an `At` can hold: left alone.
                tracing::debug!(name = ?name, "a file not ours in the staging directory");
                continue;
            };
            let id = name
                .strip_suffix(".data")
                .and_then(|n| u64::from_str_radix(n, 16).ok());
            match id {
                Some(id) => ids.push(id),
                None => other.push(self.staging.at(name)),
            }
        }
        ids.sort_unstable();
        Ok((ids, other))
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Staging file `id`, in the held staging directory.
    pub fn staging(&self, id: u64) -> At {
        self.staging.at(staging_file_name(id))
    }

    /// Where staging file `id` is kept aside (`damaged`, `orphan`): not a staging file's name,
    /// so nothing uploads or removes it.
    pub fn staging_aside(&self, id: u64, why: &str) -> At {
        self.staging.at(format!("{id:016x}.{why}"))
    }

    pub fn staging_dir(&self) -> &Arc<Dir> {
        &self.staging
    }

    /// Makes the names of newly created staging files durable (a power loss must not leave a
    /// journal record whose staging file vanished with its directory entry).
    pub fn sync_staging_names(&self) -> std::io::Result<()> {
        self.staging.sync()
    }

    pub fn journal_dir(&self) -> &Arc<Dir> {
        &self.journal
    }
}

/// Reads the tag of the cache directory `root`, making one the first time.
fn mount_tag(root: &Arc<Dir>) -> Result<String, String> {
    let at = root.at("mount-id");
    match at.read() {
        Ok(text) => {
            let text = String::from_utf8_lossy(&text);
            let tag = text.trim();
            if tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(tag.to_string());
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        // A tag that cannot be read is not replaced: with a new one, the mount would take
        // its own temporary parts in the bucket for another mount's.
        Err(e) => return Err(format!("cannot read {at}: {e}")),
    }
    let tag = format!("{:016x}", rand::random::<u64>());
    at.replace_with(tag.as_bytes())
        .map_err(|e| format!("cannot write {at}: {e}"))?;
    Ok(tag)
}

/// The marker of a cache directory: the file naming the bucket and prefix its journal
/// records belong to (I11).
pub const MARKER: &str = "owner";

/// Our sub-directory inside a `--cache-dir` the user names. Not `bucketdrive`: naming the
/// user's cache directory itself must not put a mount's files among the default directories,
/// which live in `<user cache>/bucketdrive/`.
pub const SUBDIR: &str = "bucketdrive-cache";

/// The bucket and prefix a cache directory's records belong to. Journal records carry only
/// the object key: this, in the directory's [`MARKER`], is what ties them to a bucket.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Owner {
    pub bucket: String,
    /// Without leading or trailing `/` (`a/b`, or empty for the whole bucket), however the
    /// mount spelled it.
    pub prefix: String,
}

impl Owner {
    pub fn new(bucket: &str, prefix: &str) -> Self {
        Owner {
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
        }
    }

    /// The name of this owner's own directory: `<bucket>-<CRC32C of bucket/prefix>`.
    pub fn dir_name(&self) -> String {
        let crc = crc32c::crc32c(format!("{}/{}", self.bucket, self.prefix).as_bytes());
        local_name(format!("{}-{crc:08x}", self.bucket))
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "{}", self.bucket)
        } else {
            write!(f, "{}/{}", self.bucket, self.prefix)
        }
    }
}

/// What a directory's [`MARKER`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// No marker: a new directory, or one an earlier version made.
    Absent,
    Owner(Owner),
    /// A marker that cannot be read as one: its owner is unknown.
    Damaged,
}

/// Reads the marker of the cache directory at `root`. Only reads.
pub fn read_marker(root: &Path) -> Marker {
    parse_marker(std::fs::read(root.join(MARKER)))
}

/// What a marker's bytes, or the failure to read them, say.
fn parse_marker(read: std::io::Result<Vec<u8>>) -> Marker {
    match read {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Marker::Absent,
        Err(_) => Marker::Damaged,
        Ok(bytes) => match serde_json::from_slice::<Owner>(&bytes) {
            Ok(o) if !o.bucket.is_empty() && o.prefix == o.prefix.trim_matches('/') => {
                Marker::Owner(o)
            }
            _ => Marker::Damaged,
        },
    }
}

/// Writes `owner` as the marker of `root`, durably (a temporary file renamed over it, then
/// the directory synced), before anything is staged there.
fn write_marker(root: &Arc<Dir>, owner: &Owner) -> Result<(), String> {
    let at = root.at(MARKER);
    let mut text = serde_json::to_string(owner).map_err(|e| format!("cannot write {at}: {e}"))?;
    text.push('\n');
    at.replace_with(text.as_bytes())
        .map_err(|e| format!("cannot write {at}: {e}"))
}

/// Errors of [`CacheDir::claim`]: the open directory's records may belong elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimError {
    /// The marker names another bucket or prefix.
    Theirs { root: PathBuf, owner: Owner },
    /// Records, and no marker (an earlier version) or a damaged one: their bucket is unknown.
    Unknown { root: PathBuf, damaged: bool },
    /// The directory could not be read or the marker written.
    Io(String),
}

impl std::fmt::Display for ClaimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClaimError::Theirs { root, owner } => write!(
                f,
                "cache directory {} belongs to {owner}: what it holds is uploaded there only",
                root.display()
            ),
            ClaimError::Unknown { root, damaged } => write!(
                f,
                "cache directory {} holds staged files {}, so their bucket is unknown; they are \
                 not uploaded without --adopt-staged",
                root.display(),
                if *damaged {
                    "and its marker is damaged"
                } else {
                    "from an earlier bucketdrive version, which did not record it"
                }
            ),
            ClaimError::Io(e) => f.write_str(e),
        }
    }
}

impl CacheDir {
    /// Ties this (locked) directory to `owner` before anything is staged or replayed: fine when
    /// its marker names `owner`; a directory with no journal records (new, or from an earlier
    /// version with nothing left, or with a damaged marker) gets the marker; so does one whose
    /// records have no known owner when `adopt` says they are `owner`'s. Anything else is
    /// refused: records are never uploaded to a bucket or prefix they may not belong to.
    pub fn claim(&self, owner: &Owner, adopt: bool) -> Result<(), ClaimError> {
        let records = super::journal::holds_records_in(&self.journal).map_err(|e| {
            ClaimError::Io(format!(
                "cannot read the journal in {}: {e}",
                self.journal.path().display()
            ))
        })?;
        let marker = parse_marker(self.root.at(MARKER).read());
        match marker {
            Marker::Owner(o) if &o == owner => Ok(()),
            Marker::Owner(o) => Err(ClaimError::Theirs {
                root: self.root().to_path_buf(),
                owner: o,
            }),
            Marker::Absent | Marker::Damaged if !records || adopt => {
                if records {
                    tracing::warn!(cache_dir = %self.root().display(), owner = %owner, "adopting files staged without a known bucket (--adopt-staged)");
                }
                write_marker(&self.root, owner).map_err(ClaimError::Io)
            }
            Marker::Absent | Marker::Damaged => Err(ClaimError::Unknown {
                root: self.root().to_path_buf(),
                damaged: marker == Marker::Damaged,
            }),
        }
    }
}

/// Whether another process holds the lock of the cache directory at `root` (a live mount).
/// Only takes the lock for a moment, never creates it.
fn locked(root: &Path) -> bool {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    match options.open(root.join("lock")) {
        Ok(f) => matches!(f.try_lock(), Err(TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

/// Where the default cache directories live: `<user cache>/bucketdrive`.
pub fn default_container() -> PathBuf {
    platform::user_cache_base().join("bucketdrive")
}

/// The name earlier versions gave the default cache directory of a mount: one per bucket,
/// prefix *and* mountpoint. Still the directory of a second mount of the same bucket and prefix
/// while the first holds [`Owner::dir_name`].
fn per_mountpoint_name(owner: &Owner, mountpoint: &Path) -> String {
    let crc = crc32c::crc32c(
        format!("{}/{}@{}", owner.bucket, owner.prefix, mountpoint.display()).as_bytes(),
    );
    local_name(format!("{}-{crc:08x}", owner.bucket))
}

/// A directory name made from a bucket's, as this platform can hold it. Windows reserves the
/// device names (`CON`, `NUL`, `LPT1`, … with any extension), and a bucket may be called
/// `con.example`: there the first letter is shown full-width (`ｃon.example-…`), as the drive
/// shows such object names ([`crate::windows::names`]). Bucket names hold nothing else Windows
/// forbids. Elsewhere the name is used as it is.
fn local_name(name: String) -> String {
    #[cfg(windows)]
    return crate::windows::names::to_windows(&name);
    #[cfg(not(windows))]
    name
}

/// What a candidate directory holds, as far as a mount of `owner` is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    /// Nothing staged and no owner: free to take.
    Free,
    Ours {
        records: bool,
    },
    Theirs(Owner),
    /// Records whose owner is unknown (no marker, or a damaged one).
    Unknown {
        damaged: bool,
    },
}

fn inspect(root: &Path, owner: &Owner) -> Result<Found, String> {
    let journal = root.join("journal");
    let records = super::journal::holds_records(&journal)
        .map_err(|e| format!("cannot read the journal in {}: {e}", journal.display()))?;
    Ok(match read_marker(root) {
        Marker::Owner(o) if &o == owner => Found::Ours { records },
        Marker::Owner(o) => Found::Theirs(o),
        Marker::Absent | Marker::Damaged if !records => Found::Free,
        Marker::Absent => Found::Unknown { damaged: false },
        Marker::Damaged => Found::Unknown { damaged: true },
    })
}

/// Where a mount's cache directory is. Decided once at start-up, before the log or anything
/// else creates a directory, so every user of the root (the log file, the write path, the
/// control socket) gets the same answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheRoot {
    pub path: PathBuf,
    /// `path` is a directory the user named that holds an earlier version's layout: used as
    /// it is, its own mode untouched.
    pub legacy: bool,
    /// `path` holds records without a known owner that the user said are this mount's
    /// (`--adopt-staged`), or that an earlier version's default directory of this very
    /// bucket, prefix and mountpoint holds: [`CacheDir::claim`] marks it as ours.
    pub adopt: bool,
    /// One line each about staged files found elsewhere that this mount does not upload, and
    /// why; told in the log and, before detaching, on the terminal.
    pub notes: Vec<String>,
}

impl CacheRoot {
    /// A root at `path`, nothing more to say about it.
    pub fn at(path: PathBuf) -> Self {
        CacheRoot {
            path,
            legacy: false,
            adopt: false,
            notes: Vec::new(),
        }
    }

    /// The default root of a mount of `owner` at `mountpoint`, in [`default_container`].
    pub fn default_for(owner: &Owner, mountpoint: &Path, adopt: bool) -> Result<Self, String> {
        Self::default_in(&default_container(), owner, mountpoint, adopt)
    }

    /// The default root in `container`: one per bucket and prefix, [`Owner::dir_name`], so a
    /// mount finds what was staged before wherever it is mounted. A second mount of the same
    /// bucket and prefix while the first runs takes the per-mountpoint directory earlier
    /// versions used. Before either, any directory of `owner` there that holds records and no
    /// live mount holds (a per-mountpoint one left by a crash, an earlier version's of this
    /// mountpoint) is taken, so its files are uploaded; others of `owner` with records are
    /// named in [`Self::notes`], and taken by a later mount once this one has nothing left.
    /// Only reads.
    pub fn default_in(
        container: &Path,
        owner: &Owner,
        mountpoint: &Path,
        adopt: bool,
    ) -> Result<Self, String> {
        let shared = container.join(owner.dir_name());
        let per_mount = container.join(per_mountpoint_name(owner, mountpoint));
        let mut others: Vec<PathBuf> = Vec::new();
        let mut notes = Vec::new();
        if let Ok(entries) = std::fs::read_dir(container) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path == shared || path == per_mount || !path.is_dir() {
                    continue;
                }
                match read_marker(&path) {
                    Marker::Owner(o) if &o == owner => others.push(path),
                    Marker::Absent
                        if is_earlier_default_name(&entry.file_name(), owner)
                            && super::journal::holds_records(&path.join("journal"))
                                .unwrap_or(false) =>
                    {
                        notes.push(format!(
                            "{} holds files an earlier bucketdrive version staged for bucket {} \
                             at another mountpoint or prefix; mount that again there to upload \
                             them",
                            path.display(),
                            owner.bucket
                        ));
                    }
                    _ => {}
                }
            }
        }
        others.sort();
        // (directory, identified by its name as an earlier version's of this very mount)
        let candidates = [(shared.clone(), false), (per_mount.clone(), true)]
            .into_iter()
            .chain(others.into_iter().map(|p| (p, false)));
        let mut pending: Vec<(PathBuf, bool)> = Vec::new();
        let mut usable: Vec<PathBuf> = Vec::new();
        for (path, identified) in candidates {
            if locked(&path) {
                continue;
            }
            let is_default = path == shared || path == per_mount;
            match inspect(&path, owner)? {
                Found::Ours { records: true } => pending.push((path, false)),
                Found::Ours { records: false } | Found::Free if is_default => usable.push(path),
                Found::Unknown { damaged: false } if identified => pending.push((path, true)),
                Found::Unknown { .. } if adopt => pending.push((path, true)),
                Found::Unknown { damaged } if is_default => {
                    return Err(unknown_refusal(&path, owner, damaged))
                }
                _ => {}
            }
        }
        let (path, adopt) = match pending.first() {
            Some(first) => first.clone(),
            None => match usable.first() {
                Some(p) => (p.clone(), false),
                None => {
                    return Err(format!(
                        "no usable cache directory for {owner} in {}: {} and {} are in use or \
                         belong to another bucket; give this mount a --cache-dir",
                        container.display(),
                        shared.display(),
                        per_mount.display()
                    ))
                }
            },
        };
        for (other, _) in pending.iter().skip(1) {
            notes.push(format!(
                "{} also holds files staged for {owner}; a later mount uploads them once {} \
                 has nothing left to upload",
                other.display(),
                path.display()
            ));
        }
        Ok(CacheRoot {
            path,
            legacy: false,
            adopt,
            notes,
        })
    }

    /// The root inside `named`, a directory the user gave as `--cache-dir`, for a mount of
    /// `owner`. The candidates, in order: `named` itself when it holds an earlier version's
    /// layout (used in place), `named/`[`SUBDIR`], then `named/`[`SUBDIR`]`/`[`Owner::dir_name`],
    /// the directory of a bucket or prefix that finds [`SUBDIR`] taken by another. The one
    /// holding `owner`'s records is used; else the first that is `owner`'s, else the first
    /// free one. Fails, with a one-line message saying what to do, when records whose bucket
    /// is unknown are there (unless `adopt`: they are `owner`'s), when two candidates hold
    /// records (one would be ignored), and when the earlier layout must not be used (someone
    /// else could write to it). Only reads.
    pub fn in_user_dir(named: &Path, owner: &Owner, adopt: bool) -> Result<Self, String> {
        let ours = named.join(SUBDIR);
        let mut candidates = Vec::new();
        if holds_earlier_layout(named) {
            if let Err(why) = legacy_is_safe(named) {
                return Err(format!(
                    "{dir} holds files staged by an earlier bucketdrive version, but {why}; make \
                     it yours and not group/other-writable (chmod go-w {dir}), or move those \
                     files (lock, mount-id, staging/, journal/) away",
                    dir = named.display()
                ));
            }
            candidates.push((named.to_path_buf(), true));
        }
        candidates.push((ours.clone(), false));
        candidates.push((ours.join(owner.dir_name()), false));
        let mut pending = Vec::new();
        let mut mine = Vec::new();
        let mut free = Vec::new();
        for (path, legacy) in candidates {
            match inspect(&path, owner)? {
                Found::Ours { records: true } => pending.push((path, legacy, false)),
                Found::Ours { records: false } => mine.push((path, legacy)),
                Found::Free => free.push((path, legacy)),
                Found::Theirs(_) => {}
                Found::Unknown { .. } if adopt => pending.push((path, legacy, true)),
                Found::Unknown { damaged } => return Err(unknown_refusal(&path, owner, damaged)),
            }
        }
        if pending.len() > 1 {
            return Err(format!(
                "{first} and {second} both hold files staged for {owner}: one would be ignored. \
                 Mount once with --cache-dir {second} to upload those, then again with \
                 --cache-dir {dir}",
                first = pending[0].0.display(),
                second = pending[1].0.display(),
                dir = named.display()
            ));
        }
        let (path, legacy, adopt) = match (pending.pop(), mine.first(), free.first()) {
            (Some(p), _, _) => p,
            (None, Some((p, legacy)), _) | (None, None, Some((p, legacy))) => {
                (p.clone(), *legacy, false)
            }
            (None, None, None) => {
                return Err(format!(
                    "no usable cache directory for {owner} in {}: {} belongs to another bucket \
                     or prefix; give this mount another --cache-dir",
                    named.display(),
                    ours.join(owner.dir_name()).display()
                ))
            }
        };
        Ok(CacheRoot {
            path,
            legacy,
            adopt,
            notes: Vec::new(),
        })
    }

    /// Makes sure the root exists before [`CacheDir::open`] does (the detached mount's log
    /// file lives there and is opened first), with the same checks; an earlier layout in place
    /// is left as it is.
    pub fn ensure(&self) -> Result<(), String> {
        if self.legacy {
            return Ok(());
        }
        Dir::private(&self.path)
            .map(drop)
            .map_err(|e| format!("cannot use cache directory {}: {e}", self.path.display()))
    }
}

/// The refusal of a mount of `owner` that finds, at `path`, records whose bucket is unknown.
fn unknown_refusal(path: &Path, owner: &Owner, damaged: bool) -> String {
    let why = if damaged {
        format!("its marker ({MARKER}) is damaged")
    } else {
        "they were staged by an earlier bucketdrive version, which did not record it".to_string()
    };
    format!(
        "{} holds staged files whose bucket is unknown ({why}); if they belong to {owner}, \
         mount once with --adopt-staged to upload them there, otherwise give this mount \
         another --cache-dir",
        path.display()
    )
}

/// Whether `name` is what an earlier version called a default cache directory of `owner`'s
/// bucket: `<bucket>-` and eight hex digits.
fn is_earlier_default_name(name: &std::ffi::OsStr, owner: &Owner) -> bool {
    name.to_str()
        .and_then(|n| n.strip_prefix(owner.bucket.as_str()))
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|hex| hex.len() == 8 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether `dir` holds the layout an earlier version left when it used a named directory
/// itself as the root. The marker is the three names every earlier version created on every
/// open, before anything was staged, and never removed: `staging/` and `journal/`, then the
/// `lock` file. Not `mount-id` (it came later) nor `journal/journal.log` (the first versions
/// kept one `journal/<id>.json` per record). All three are required: a directory of the
/// user's that merely has a `staging/` or `journal/` of its own must not be taken for ours,
/// since we would then write into it, narrow its sub-directories to 0700 and delete its files
/// named like staging files. Only names are looked at; whether the directory is safe to use is
/// [`legacy_is_safe`], and [`CacheDir::open_at`] refuses links and files not ours as usual.
fn holds_earlier_layout(dir: &Path) -> bool {
    dir.join("lock").is_file() && dir.join("staging").is_dir() && dir.join("journal").is_dir()
}

/// An earlier layout is used in place only if the directory is ours and no one else can
/// write to it (the earlier versions made it 0700); otherwise anyone could have planted those
/// files, in `/tmp` say.
fn legacy_is_safe(dir: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(dir).map_err(|e| format!("it cannot be read: {e}"))?;
        // SAFETY: geteuid cannot fail.
        if meta.uid() != unsafe { libc::geteuid() } {
            return Err(format!("it belongs to user {}", meta.uid()));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "others can write to it (mode {:o})",
                meta.mode() & 0o7777
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sets a directory's mode bits. Windows has none (our directories get a protected DACL
    /// there, checked by platform::windows_acl's test), so there it does nothing.
    fn set_mode(p: &Path, m: u32) {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        }
        #[cfg(windows)]
        let _ = (p, m);
    }

    /// The bucket most tests mount.
    fn owner() -> Owner {
        Owner::new("bkt", "")
    }

    /// What a mount of `who` leaves in `root` when it dies with a file staged: its marker, a
    /// staging file and a journal line (a damaged one, which counts as a record).
    fn staged_by(root: &Path, who: &Owner) {
        let c = CacheDir::open(root).unwrap();
        c.claim(who, false).unwrap();
        std::fs::write(c.staging(3).path(), b"staged").unwrap();
        std::fs::write(c.journal_dir().path().join("journal.log"), b"a record\n").unwrap();
    }

    #[test]
    fn two_mounts_cannot_share_a_cache_dir() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("c");
        let first = CacheDir::open(&root).unwrap();
        #[cfg(unix)]
        assert_eq!(mode(&root), 0o700);
        let err = CacheDir::open(&root).unwrap_err();
        assert!(err.contains("in use by another mount"), "{err}");
        let tag = first.tag().to_string();
        drop(first);
        let again = CacheDir::open(&root).unwrap();
        assert_eq!(again.tag(), tag, "the tag is kept across mounts");
        let other = CacheDir::open(&dir.path().join("d")).unwrap();
        assert_ne!(other.tag(), tag, "each cache directory has its own");
    }

    #[cfg(unix)]
    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[cfg(unix)]
    #[test]
    fn a_named_shared_dir_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        set_mode(&shared, 0o1777);
        let CacheRoot {
            path: root, legacy, ..
        } = CacheRoot::in_user_dir(&shared, &owner(), false).unwrap();
        assert_eq!(root, shared.join(SUBDIR));
        assert!(!legacy);
        let c = CacheDir::open(&root).unwrap();
        #[cfg(unix)]
        assert_eq!(
            mode(&shared),
            0o1777,
            "the named directory is not ours to change"
        );
        #[cfg(unix)]
        assert_eq!(mode(&root), 0o700);
        #[cfg(unix)]
        assert_eq!(mode(&root.join("staging")), 0o700);
        drop(c);
        // A named directory that does not exist yet is made private, with ours inside.
        let fresh = dir.path().join("a/b");
        let root = CacheRoot::in_user_dir(&fresh, &owner(), false).unwrap();
        assert!(!fresh.exists(), "deciding creates nothing");
        CacheDir::open(&root.path).unwrap();
        #[cfg(unix)]
        assert_eq!(mode(&fresh), 0o700);
    }

    #[cfg(unix)]
    #[test]
    fn our_directories_are_narrowed_and_links_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("c");
        std::fs::create_dir(&root).unwrap();
        set_mode(&root, 0o755);
        drop(CacheDir::open(&root).unwrap());
        #[cfg(unix)]
        assert_eq!(mode(&root), 0o700);

        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        set_mode(&elsewhere, 0o755);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let err = CacheDir::open(&link).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        #[cfg(unix)]
        assert_eq!(
            mode(&elsewhere),
            0o755,
            "nothing was changed through the link"
        );
        assert!(!elsewhere.join("staging").exists());

        // A staging directory swapped for a link is refused too.
        let root2 = dir.path().join("c2");
        std::fs::create_dir(&root2).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root2.join("staging")).unwrap();
        let err = CacheDir::open(&root2).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn a_directory_of_someone_else_is_refused() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to give a directory away");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("c");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::chown(&root, Some(4321), None).unwrap();
        let err = CacheDir::open(&root).unwrap_err();
        assert!(err.contains("belongs to user 4321"), "{err}");
        // An earlier layout in someone else's directory is neither used nor skipped.
        std::fs::create_dir(root.join("journal")).unwrap();
        std::fs::create_dir(root.join("staging")).unwrap();
        std::fs::write(root.join("lock"), b"").unwrap();
        let err = CacheRoot::in_user_dir(&root, &owner(), true).unwrap_err();
        assert!(err.contains("belongs to user 4321"), "{err}");
        assert!(err.contains("make it yours"), "{err}");
    }

    /// Leaves in `named` what an earlier version left there: the directory itself as the
    /// root, with one file staged and journaled.
    fn earlier_layout(named: &Path) -> String {
        let c = CacheDir::open(named).unwrap();
        std::fs::write(c.staging(7).path(), b"staged").unwrap();
        std::fs::write(c.journal_dir().path().join("journal.log"), b"a record\n").unwrap();
        c.tag().to_string()
    }

    #[test]
    fn an_earlier_layout_is_used_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("old");
        let tag = earlier_layout(&named);
        set_mode(&named, 0o750);
        // It did not record its bucket: used only when the user says it is this mount's.
        let err = CacheRoot::in_user_dir(&named, &owner(), false).unwrap_err();
        assert!(!err.contains('\n'), "one line: {err}");
        assert!(err.contains("earlier bucketdrive version"), "{err}");
        assert!(err.contains("--adopt-staged"), "{err}");
        assert!(!named.join(SUBDIR).exists(), "deciding creates nothing");
        let root = CacheRoot::in_user_dir(&named, &owner(), true).unwrap();
        assert_eq!(root.path, named);
        assert!(root.legacy);
        assert!(root.adopt);
        root.ensure().unwrap();
        let c = CacheDir::open_at(&root.path, root.legacy).unwrap();
        assert_eq!(
            c.claim(&owner(), false),
            Err(ClaimError::Unknown {
                root: named.clone(),
                damaged: false
            }),
            "not without adopting"
        );
        c.claim(&owner(), root.adopt).unwrap();
        assert_eq!(read_marker(&named), Marker::Owner(owner()));
        assert_eq!(c.tag(), tag, "the same tag, so its parts are recognised");
        assert_eq!(c.staging_ids().unwrap().0, vec![7]);
        #[cfg(unix)]
        assert_eq!(mode(&named), 0o750, "left as it is");
        assert!(!named.join(SUBDIR).exists());
    }

    #[test]
    fn the_first_versions_layout_is_recognised() {
        // Before `mount-id` and `journal.log`: `lock`, `staging/`, one file per record.
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("first");
        for d in ["staging", "journal"] {
            std::fs::create_dir_all(named.join(d)).unwrap();
        }
        std::fs::write(named.join("lock"), b"").unwrap();
        std::fs::write(named.join("journal").join("0000000000000001.json"), b"{}").unwrap();
        let root = CacheRoot::in_user_dir(&named, &owner(), true).unwrap();
        assert_eq!(root.path, named);
        assert!(root.legacy);
    }

    #[test]
    fn the_decision_does_not_depend_on_the_sub_directory() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("old");
        earlier_layout(&named);
        let first = CacheRoot::in_user_dir(&named, &owner(), true).unwrap();
        assert!(first.legacy);
        // What a detached mount's log leaves before the cache directory is opened: our
        // sub-directory, with a log file in it. Nothing changes, however often it is asked.
        let ours = named.join(SUBDIR);
        CacheRoot::at(ours.clone()).ensure().unwrap();
        std::fs::write(ours.join("bucketdrive.log"), b"log\n").unwrap();
        for _ in 0..3 {
            assert_eq!(
                CacheRoot::in_user_dir(&named, &owner(), true).unwrap(),
                first
            );
        }
        // Even a sub-directory used before, whose journal has nothing left to upload.
        drop(CacheDir::open(&ours).unwrap());
        std::fs::write(ours.join("journal").join("journal.log"), b"").unwrap();
        assert_eq!(
            CacheRoot::in_user_dir(&named, &owner(), true).unwrap(),
            first
        );
    }

    #[test]
    fn an_earlier_layout_beside_a_used_sub_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("old");
        earlier_layout(&named);
        let ours = named.join(SUBDIR);
        drop(CacheDir::open(&ours).unwrap());
        // A journal of the older form is enough to show a staged file.
        std::fs::write(ours.join("journal").join("0000000000000002.json"), b"{}").unwrap();
        let err = CacheRoot::in_user_dir(&named, &owner(), true).unwrap_err();
        assert!(!err.contains('\n'), "one line: {err}");
        assert!(err.contains("one would be ignored"), "{err}");
        assert!(
            err.contains(&format!("--cache-dir {}", ours.display())),
            "{err}"
        );
        // What the message says: the sub-directory, named itself, is an earlier layout too.
        let sub = CacheRoot::in_user_dir(&ours, &owner(), true).unwrap();
        assert_eq!(sub.path, ours);
        assert!(sub.legacy);
    }

    #[cfg(unix)]
    #[test]
    fn an_earlier_layout_others_may_write_to_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("old");
        earlier_layout(&named);
        for m in [0o2770, 0o777, 0o1777] {
            set_mode(&named, m);
            for _ in 0..2 {
                let err = CacheRoot::in_user_dir(&named, &owner(), true).unwrap_err();
                assert!(!err.contains('\n'), "one line: {err}");
                assert!(err.contains(&format!("mode {m:o}")), "{err}");
                assert!(
                    err.contains(&format!("chmod go-w {}", named.display())),
                    "{err}"
                );
            }
            assert!(!named.join(SUBDIR).exists(), "deciding creates nothing");
            #[cfg(unix)]
            assert_eq!(mode(&named), m, "and changes nothing");
        }
        set_mode(&named, 0o2750);
        assert!(
            CacheRoot::in_user_dir(&named, &owner(), true)
                .unwrap()
                .legacy
        );
    }

    #[test]
    fn an_ordinary_directory_is_not_an_earlier_layout() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        // A project with `staging/` and `journal/` of its own, and even a `mount-id`.
        for d in ["staging", "journal"] {
            std::fs::create_dir_all(work.join(d)).unwrap();
            set_mode(&work.join(d), 0o755);
        }
        let theirs = work.join("staging").join("0000000000000001.data");
        std::fs::write(&theirs, b"theirs").unwrap();
        std::fs::write(work.join("mount-id"), b"0123456789abcdef").unwrap();
        let root = CacheRoot::in_user_dir(&work, &owner(), false).unwrap();
        assert_eq!(root.path, work.join(SUBDIR));
        assert!(!root.legacy);
        drop(CacheDir::open_at(&root.path, root.legacy).unwrap());
        assert!(theirs.exists());
        #[cfg(unix)]
        assert_eq!(mode(&work.join("staging")), 0o755, "theirs, left alone");
        assert!(!work.join("lock").exists());
        // `lock` with only one of the two directories is not it either.
        let half = dir.path().join("half");
        std::fs::create_dir_all(half.join("staging")).unwrap();
        std::fs::write(half.join("lock"), b"").unwrap();
        assert!(
            !CacheRoot::in_user_dir(&half, &owner(), false)
                .unwrap()
                .legacy
        );
    }

    #[test]
    fn the_marker_ties_a_directory_to_one_bucket_and_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("c");
        let a = Owner::new("bkt", "");
        assert_eq!(Owner::new("bkt", "/p/q/"), Owner::new("bkt", "p/q"));
        let c = CacheDir::open(&root).unwrap();
        assert_eq!(
            read_marker(&root),
            Marker::Absent,
            "opening alone writes nothing"
        );
        c.claim(&a, false).unwrap();
        assert_eq!(read_marker(&root), Marker::Owner(a.clone()));
        #[cfg(unix)]
        assert_eq!(
            mode(&root.join(MARKER)),
            0o600,
            "a private file like the others"
        );
        c.claim(&a, false).unwrap();
        // Another bucket, and the same bucket under a prefix: neither is it, even adopting.
        for other in [Owner::new("other", ""), Owner::new("bkt", "p")] {
            for adopt in [false, true] {
                let err = c.claim(&other, adopt).unwrap_err();
                assert_eq!(
                    err,
                    ClaimError::Theirs {
                        root: root.clone(),
                        owner: a.clone()
                    }
                );
                assert!(err.to_string().contains("belongs to bkt"), "{err}");
            }
        }
        assert_eq!(read_marker(&root), Marker::Owner(a.clone()), "unchanged");
        // A prefix is part of the name: each has a directory of its own.
        let names: std::collections::HashSet<_> = [
            Owner::new("bkt", ""),
            Owner::new("bkt", "p"),
            Owner::new("bkt", "p/q"),
            Owner::new("other", ""),
        ]
        .iter()
        .map(Owner::dir_name)
        .collect();
        assert_eq!(names.len(), 4);
        assert_eq!(
            Owner::new("bkt", "/p/").dir_name(),
            Owner::new("bkt", "p").dir_name()
        );
    }

    #[test]
    fn a_damaged_marker_is_no_owner() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("named");
        let ours = named.join(SUBDIR);
        staged_by(&ours, &owner());
        for garbage in [
            &b"{\"bucket\":\"bk"[..],
            b"",
            b"{\"bucket\":\"\",\"prefix\":\"\"}",
            b"\xff\xfe",
        ] {
            std::fs::write(ours.join(MARKER), garbage).unwrap();
            assert_eq!(read_marker(&ours), Marker::Damaged);
            // Its records may be anyone's: not used, not skipped, unless adopted.
            let err = CacheRoot::in_user_dir(&named, &owner(), false).unwrap_err();
            assert!(!err.contains('\n'), "one line: {err}");
            assert!(err.contains("marker (owner) is damaged"), "{err}");
            assert!(err.contains(&ours.display().to_string()), "{err}");
            let root = CacheRoot::in_user_dir(&named, &owner(), true).unwrap();
            assert_eq!(root.path, ours);
            assert!(root.adopt);
            let c = CacheDir::open(&ours).unwrap();
            assert_eq!(
                c.claim(&owner(), false),
                Err(ClaimError::Unknown {
                    root: ours.clone(),
                    damaged: true
                })
            );
            drop(c);
        }
        // With nothing staged, a damaged marker is simply written again.
        std::fs::write(ours.join("journal").join("journal.log"), b"").unwrap();
        let root = CacheRoot::in_user_dir(&named, &Owner::new("x-y", "z"), false).unwrap();
        assert_eq!(root.path, ours);
        assert!(!root.adopt);
        let c = CacheDir::open(&ours).unwrap();
        c.claim(&Owner::new("x-y", "z"), false).unwrap();
        assert_eq!(read_marker(&ours), Marker::Owner(Owner::new("x-y", "z")));
    }

    #[test]
    fn buckets_sharing_a_named_dir_each_keep_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("shared");
        let ours = named.join(SUBDIR);
        let a = Owner::new("bkt-a", "");
        let b = Owner::new("bkt-b", "");
        let a_p = Owner::new("bkt-a", "p");
        // The first mount takes our sub-directory and dies with a file staged.
        assert_eq!(
            CacheRoot::in_user_dir(&named, &a, false).unwrap().path,
            ours
        );
        staged_by(&ours, &a);
        // Another bucket, or the same bucket under a prefix, gets a sub-directory of its own.
        let for_b = CacheRoot::in_user_dir(&named, &b, false).unwrap();
        assert_eq!(for_b.path, ours.join(b.dir_name()));
        assert!(!for_b.legacy && !for_b.adopt);
        let for_a_p = CacheRoot::in_user_dir(&named, &a_p, false).unwrap();
        assert_eq!(for_a_p.path, ours.join(a_p.dir_name()));
        assert_ne!(for_a_p.path, for_b.path);
        // Adopting changes nothing here: those records have an owner.
        assert_eq!(CacheRoot::in_user_dir(&named, &b, true).unwrap(), for_b);
        // B stages a file of its own; each bucket still finds its own.
        staged_by(&for_b.path, &b);
        assert_eq!(
            CacheRoot::in_user_dir(&named, &a, false).unwrap().path,
            ours
        );
        assert_eq!(CacheRoot::in_user_dir(&named, &b, false).unwrap(), for_b);
        let c = CacheDir::open(&for_b.path).unwrap();
        assert!(c.claim(&a, true).is_err(), "A never takes B's");
        // One mount per directory still: a second mount of B is refused while the first runs.
        let err = CacheDir::open(&for_b.path).unwrap_err();
        assert!(err.contains("in use by another mount"), "{err}");
        drop(c);
        // And A's root is not B's staging area: opening A's as B's is refused at the claim.
        let c = CacheDir::open(&ours).unwrap();
        assert!(matches!(c.claim(&b, false), Err(ClaimError::Theirs { .. })));
    }

    #[test]
    fn an_unmarked_sub_directory_with_records_is_refused_not_guessed() {
        // What this version left before it wrote markers: records of some bucket.
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("named");
        let ours = named.join(SUBDIR);
        let c = CacheDir::open(&ours).unwrap();
        std::fs::write(c.journal_dir().path().join("journal.log"), b"a record\n").unwrap();
        drop(c);
        for who in [owner(), Owner::new("another", "x")] {
            let err = CacheRoot::in_user_dir(&named, &who, false).unwrap_err();
            assert!(err.contains("earlier bucketdrive version"), "{err}");
            assert!(err.contains(&format!("belong to {who}")), "{err}");
        }
        assert!(
            !ours.join(owner().dir_name()).exists(),
            "deciding creates nothing"
        );
        let root = CacheRoot::in_user_dir(&named, &owner(), true).unwrap();
        assert_eq!(
            (root.path.clone(), root.legacy, root.adopt),
            (ours.clone(), false, true)
        );
        // Without records it is simply taken.
        std::fs::write(ours.join("journal").join("journal.log"), b"").unwrap();
        let root = CacheRoot::in_user_dir(&named, &owner(), false).unwrap();
        assert_eq!((root.path, root.adopt), (ours, false));
    }

    #[test]
    fn a_bucket_named_like_a_device_gets_a_cache_directory_too() {
        // `con.example` is a valid bucket name; on Windows `CON` with any extension names the
        // console, never a directory.
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("bucketdrive");
        for bucket in ["con.example", "nul", "lpt1.x", "aux.y.z"] {
            let who = Owner::new(bucket, "");
            let root = CacheRoot::default_in(&home, &who, Path::new("/mnt/a"), false).unwrap();
            let c = CacheDir::open(&root.path).unwrap();
            c.claim(&who, false).unwrap();
            StagingFilePut::put(&c, 1, b"staged");
            assert_eq!(
                std::fs::read(c.staging(1).path()).unwrap(),
                b"staged",
                "{bucket}"
            );
            drop(c);
            assert_eq!(
                CacheRoot::default_in(&home, &who, Path::new("/mnt/b"), false).unwrap(),
                root,
                "{bucket}: found again"
            );
        }
    }

    /// Writes `bytes` as staging file `id` through the held directory.
    struct StagingFilePut;
    impl StagingFilePut {
        fn put(c: &CacheDir, id: u64, bytes: &[u8]) {
            use std::io::Write;
            let mut f = c
                .staging(id)
                .open(Open::new().write(true).create(true).truncate(true))
                .unwrap();
            f.write_all(bytes).unwrap();
        }
    }

    #[test]
    fn the_default_dir_is_one_per_bucket_and_prefix_not_per_mountpoint() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("bucketdrive");
        let a = owner();
        let pick = |who: &Owner, mp: &str| CacheRoot::default_in(&home, who, Path::new(mp), false);
        let first = pick(&a, "/mnt/a").unwrap();
        assert_eq!(first.path, home.join(a.dir_name()));
        assert!(!first.legacy && !first.adopt && first.notes.is_empty());
        assert_eq!(
            pick(&a, "/mnt/b").unwrap(),
            first,
            "the same at another mountpoint"
        );
        assert_ne!(
            pick(&Owner::new("bkt", "p"), "/mnt/a").unwrap().path,
            first.path
        );
        assert_ne!(
            pick(&Owner::new("other", ""), "/mnt/a").unwrap().path,
            first.path
        );
        // A crash leaves a file staged; mounted elsewhere, the same directory replays it.
        staged_by(&first.path, &a);
        assert_eq!(pick(&a, "/mnt/b").unwrap(), first);

        // While a mount holds it, a second mount of the bucket takes its mountpoint's own.
        let held = CacheDir::open(&first.path).unwrap();
        let second = pick(&a, "/mnt/b").unwrap();
        assert_eq!(
            second.path,
            home.join(per_mountpoint_name(&a, Path::new("/mnt/b")))
        );
        staged_by(&second.path, &a);
        drop(held);
        // Both died with files staged: a mount anywhere takes one, and says where the other is.
        let third = pick(&a, "/mnt/c").unwrap();
        assert_eq!(third.path, first.path);
        assert_eq!(third.notes.len(), 1, "{:?}", third.notes);
        assert!(third.notes[0].contains(&second.path.display().to_string()));
        // Once the first has nothing left, the next mount takes the other's, at any mountpoint.
        std::fs::write(first.path.join("journal").join("journal.log"), b"").unwrap();
        let fourth = pick(&a, "/mnt/d").unwrap();
        assert_eq!(fourth.path, second.path);
        assert!(fourth.notes.is_empty());
        // Never another bucket's, nor another prefix's.
        let for_p = pick(&Owner::new("bkt", "p"), "/mnt/b").unwrap();
        assert_eq!(for_p.path, home.join(Owner::new("bkt", "p").dir_name()));
        assert!(for_p.notes.is_empty());
    }

    #[test]
    fn an_earlier_default_dir_is_adopted_only_at_its_own_mountpoint() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("bucketdrive");
        let a = owner();
        // Earlier versions: one directory per mountpoint, no marker, records of their mount.
        let old = home.join(per_mountpoint_name(&a, Path::new("/mnt/old")));
        let c = CacheDir::open(&old).unwrap();
        std::fs::write(c.journal_dir().path().join("journal.log"), b"a record\n").unwrap();
        drop(c);
        // Its name says whose it is when mounted there again: adopted, and marked.
        let there = CacheRoot::default_in(&home, &a, Path::new("/mnt/old"), false).unwrap();
        assert_eq!((there.path.clone(), there.adopt), (old.clone(), true));
        // Elsewhere, its prefix cannot be told: named, not uploaded, and never for a prefix.
        for who in [a.clone(), Owner::new("bkt", "p")] {
            let elsewhere =
                CacheRoot::default_in(&home, &who, Path::new("/mnt/new"), false).unwrap();
            assert_eq!(elsewhere.path, home.join(who.dir_name()));
            assert!(!elsewhere.adopt);
            assert_eq!(elsewhere.notes.len(), 1, "{:?}", elsewhere.notes);
            assert!(elsewhere.notes[0].contains(&old.display().to_string()));
            assert!(!elsewhere.notes[0].contains('\n'));
        }
        // Another bucket is not told about it.
        let other =
            CacheRoot::default_in(&home, &Owner::new("bk", ""), Path::new("/mnt/new"), false)
                .unwrap();
        assert!(other.notes.is_empty(), "{:?}", other.notes);
        // A damaged marker on the bucket's own directory, with records: refused.
        let shared = home.join(a.dir_name());
        staged_by(&shared, &a);
        std::fs::write(shared.join(MARKER), b"not json").unwrap();
        let err = CacheRoot::default_in(&home, &a, Path::new("/mnt/new"), false).unwrap_err();
        assert!(err.contains("damaged"), "{err}");
    }
}
