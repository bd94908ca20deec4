//! Directories of ours, held open, and the files in them, reached only through that hold.
//!
//! The cache directories hold what the mount trusts: journal records name object keys and the
//! staging files whose bytes go there, and read-cache files are served as object bytes. A path
//! is looked up again at every open, so whoever could swap a directory on it (rename another in
//! its place, plant a link) between the mount's check and a later open would choose what the
//! mount reads, uploads or truncates. So each directory is checked once, when it is opened
//! ([`Dir::private`], [`Dir::child`]): a real directory, not a link, owned by the mount's user,
//! narrowed to 0700 through its descriptor. It is then held, and every file in it is reached
//! from the held directory by a single name ([`At`]), never by path:
//!
//! - **Unix:** the directory's descriptor; files are opened with `openat(dirfd, name,
//!   O_NOFOLLOW)` and checked with `fstat` (a regular file, ours), and renames, removals and
//!   listings are `renameat`, `unlinkat` and a listing of the descriptor. Renaming or replacing
//!   a directory above changes nothing for a descriptor already held.
//! - **Windows:** a handle on the directory opened without `FILE_SHARE_DELETE`, so nobody can
//!   rename or delete it (nor, as Windows refuses to rename a directory with open handles
//!   below it, any directory above) while the mount holds it: its path keeps leading to it.
//!   Files are opened with `FILE_FLAG_OPEN_REPARSE_POINT` and refused when they are reparse
//!   points (links and junctions), the equivalent of `O_NOFOLLOW`.
//!
//! Names given to [`Dir::at`] are single components made by the mount (`<id>.data`,
//! `journal.log`), never a user's.
//!
//! Every removal, replacement or cut of a file here first runs the looks registered for its
//! file system ([`Dir::before_freeing`]): space the mount frees itself can end a dip of the
//! disk's free space that failed a write only the writer saw (the kernel's own writes to a
//! passthrough file), and a look just before the free sees the dip while it lasts.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// A look to run before this process frees space on a file system: see [`Dir::before_freeing`].
pub type FreeLook = dyn Fn() + Send + Sync;

/// The looks registered, each with the file system (device) it is for; a look lives while the
/// one who registered it keeps it.
#[cfg(unix)]
static BEFORE_FREE: std::sync::Mutex<Vec<(u64, std::sync::Weak<FreeLook>)>> =
    std::sync::Mutex::new(Vec::new());

/// A directory of ours, held open; see the module documentation.
#[derive(Debug)]
pub struct Dir {
    /// Where it was when opened: for messages, and on Windows for the opens below it.
    path: PathBuf,
    #[cfg(unix)]
    fd: std::os::fd::OwnedFd,
    /// The file system it is on (`st_dev`).
    #[cfg(unix)]
    dev: u64,
    /// Held without `FILE_SHARE_DELETE`: see the module documentation.
    #[cfg(windows)]
    hold: File,
}

/// A file of a held [`Dir`], by name.
#[derive(Debug, Clone)]
pub struct At {
    dir: Arc<Dir>,
    name: String,
}

/// How to open a file with [`At::open`]: the flags of `std::fs::OpenOptions` the mount uses.
/// Files it creates are readable only by the user (0600 on Unix).
#[derive(Debug, Clone, Copy, Default)]
pub struct Open {
    read: bool,
    write: bool,
    append: bool,
    create: bool,
    create_new: bool,
    truncate: bool,
}

impl Open {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn read(mut self, on: bool) -> Self {
        self.read = on;
        self
    }
    pub fn write(mut self, on: bool) -> Self {
        self.write = on;
        self
    }
    pub fn append(mut self, on: bool) -> Self {
        self.append = on;
        self
    }
    pub fn create(mut self, on: bool) -> Self {
        self.create = on;
        self
    }
    pub fn create_new(mut self, on: bool) -> Self {
        self.create_new = on;
        self
    }
    pub fn truncate(mut self, on: bool) -> Self {
        self.truncate = on;
        self
    }
}

/// What [`At::stat`] tells of a file, without following a link in its place.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub len: u64,
    pub is_file: bool,
    pub is_dir: bool,
    pub modified: SystemTime,
    /// Bytes it takes on disk: its allocated blocks where the platform says, else its length.
    pub disk_bytes: u64,
}

/// A refusal to use a directory (the caller names it) or a file (named here).
fn refuse(file: Option<&Path>, why: &str) -> io::Error {
    let msg = match file {
        Some(path) => format!("{}: {why}; refusing to use it", path.display()),
        None => format!("{why}; refusing to use it"),
    };
    io::Error::new(io::ErrorKind::PermissionDenied, msg)
}

impl Dir {
    /// Creates `path` if need be (with whatever of its parents is missing, 0700), opens it
    /// and checks it is a private directory of ours (see the module documentation). Only for
    /// directories bucketdrive owns, never for one the user named.
    pub fn private(path: &Path) -> io::Result<Arc<Dir>> {
        super::create_dirs(path)?;
        Self::open_checked(path, None, true).map(Arc::new)
    }

    /// Opens the existing directory at `path`, ours and not a link, as [`Dir::private`] does,
    /// but leaves its mode (and on Windows its ACL) as it is: a directory the user named that
    /// an earlier version used in place.
    pub fn as_is(path: &Path) -> io::Result<Arc<Dir>> {
        Self::open_checked(path, None, false).map(Arc::new)
    }

    /// The sub-directory `name` of this one, created (0700) if missing, opened and checked as
    /// [`Dir::private`] does, through this directory's hold.
    pub fn child(self: &Arc<Self>, name: &str) -> io::Result<Arc<Dir>> {
        let path = self.path.join(name);
        #[cfg(unix)]
        {
            use rustix::fs::{mkdirat, Mode};
            match mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        #[cfg(windows)]
        match std::fs::create_dir(&path) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        Self::open_checked(&path, Some((self, name)), true).map(Arc::new)
    }

    #[cfg(unix)]
    fn open_checked(path: &Path, parent: Option<(&Dir, &str)>, narrow: bool) -> io::Result<Dir> {
        use rustix::fs::{fchmod, fstat, openat, FileType, Mode, OFlags, CWD};
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let opened = match parent {
            Some((dir, name)) => openat(&dir.fd, name, flags, Mode::empty()),
            None => openat(CWD, path, flags, Mode::empty()),
        };
        let fd = opened.map_err(|e| match e {
            // With O_DIRECTORY, Linux answers ENOTDIR for a link to a directory.
            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR
                if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) =>
            {
                refuse(None, "it is a symbolic link")
            }
            rustix::io::Errno::NOTDIR => refuse(None, "it is not a directory"),
            e => io::Error::from(e),
        })?;
        let st = fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(refuse(None, "it is not a directory"));
        }
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if st.st_uid != me {
            return Err(refuse(
                None,
                &format!("it belongs to user {}, not to us (user {me})", st.st_uid),
            ));
        }
        if narrow && st.st_mode & 0o077 != 0 {
            fchmod(&fd, Mode::from_raw_mode(0o700))?;
        }
        Ok(Dir {
            path: path.to_path_buf(),
            fd,
            dev: st.st_dev as u64,
        })
    }

    #[cfg(windows)]
    fn open_checked(path: &Path, _parent: Option<(&Dir, &str)>, narrow: bool) -> io::Result<Dir> {
        use windows_sys::Win32::Foundation::{GENERIC_READ, GENERIC_WRITE};
        use windows_sys::Win32::Storage::FileSystem::{
            FILE_FLAG_BACKUP_SEMANTICS, FILE_SHARE_READ, FILE_SHARE_WRITE, WRITE_DAC,
        };
        // A directory opens only with backup semantics; without FILE_SHARE_DELETE in the
        // share mode nobody can rename or delete it while this handle is open. Write access
        // is for FlushFileBuffers ([`Dir::sync`]), WRITE_DAC for the private DACL.
        let mut access = GENERIC_READ | GENERIC_WRITE;
        if narrow {
            access |= WRITE_DAC;
        }
        let mut options = std::fs::OpenOptions::new();
        std::os::windows::fs::OpenOptionsExt::access_mode(&mut options, access);
        std::os::windows::fs::OpenOptionsExt::share_mode(
            &mut options,
            FILE_SHARE_READ | FILE_SHARE_WRITE,
        );
        let hold = win::open_no_link(&super::verbatim(path), &options, FILE_FLAG_BACKUP_SEMANTICS)
            .map_err(|e| match e {
                win::Refused::Link => refuse(None, "it is a link or junction"),
                win::Refused::Io(e) => e,
            })?;
        if !hold.metadata()?.is_dir() {
            return Err(refuse(None, "it is not a directory"));
        }
        // Ours, as on Unix: a directory someone else made (and so can change the DACL of
        // again) is refused, whatever it holds. Made by an elevated process it belongs to
        // Administrators; by a service, to SYSTEM.
        let me = super::windows_acl::current_user_sid()?;
        let owner = super::windows_acl::owner_sid(&hold)?;
        if ![me.as_str(), "S-1-5-32-544", "S-1-5-18"].contains(&owner.as_str()) {
            return Err(refuse(
                None,
                &format!("it belongs to {owner}, not to us ({me})"),
            ));
        }
        if narrow {
            super::windows_acl::make_private(&hold)?;
        }
        Ok(Dir {
            path: path.to_path_buf(),
            hold,
        })
    }

    /// The file `name` of this directory: a single component, made by the mount.
    pub fn at(self: &Arc<Self>, name: impl Into<String>) -> At {
        let name = name.into();
        debug_assert!(!name.contains(['/', '\\']) && name != ".." && name != ".");
        At {
            dir: self.clone(),
            name,
        }
    }

    /// Where the directory was when it was opened, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes an unprivileged writer may still write on the file system that holds this
    /// directory; `None` where that cannot be told.
    pub fn free_bytes(&self) -> Option<u64> {
        #[cfg(unix)]
        {
            let st = rustix::fs::fstatvfs(&self.fd).ok()?;
            Some(st.f_bavail.saturating_mul(st.f_frsize))
        }
        #[cfg(windows)]
        {
            None
        }
    }

    /// Runs `look` before this process removes, replaces or cuts shorter a file of any held
    /// directory on this directory's file system, for as long as the caller keeps `look`
    /// (see the module documentation). Nothing on Windows, where the kernel never writes a
    /// file for the mount.
    pub fn before_freeing(&self, look: &Arc<FreeLook>) {
        #[cfg(unix)]
        {
            let mut looks = BEFORE_FREE.lock().unwrap_or_else(|e| e.into_inner());
            looks.retain(|(_, l)| l.strong_count() > 0);
            looks.push((self.dev, Arc::downgrade(look)));
        }
        #[cfg(windows)]
        let _ = look;
    }

    /// Runs the looks registered for this directory's file system ([`Dir::before_freeing`]).
    fn freeing(&self) {
        #[cfg(unix)]
        {
            let due: Vec<Arc<FreeLook>> = BEFORE_FREE
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter(|(dev, _)| *dev == self.dev)
                .filter_map(|(_, l)| l.upgrade())
                .collect();
            for look in due {
                look();
            }
        }
    }

    /// The names in the directory (not `.` and `..`).
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            let mut out = Vec::new();
            let mut list = rustix::fs::Dir::read_from(&self.fd)?;
            while let Some(entry) = list.read() {
                let name = entry?.file_name().to_bytes().to_vec();
                if name != b"." && name != b".." {
                    out.push(std::ffi::OsStr::from_bytes(&name).to_os_string());
                }
            }
            Ok(out)
        }
        #[cfg(windows)]
        std::fs::read_dir(super::verbatim(&self.path))?
            .map(|e| e.map(|e| e.file_name()))
            .collect()
    }

    /// Makes the directory's entries (files created, renamed or removed in it) durable.
    ///
    /// Windows: `FlushFileBuffers` on the held handle, which NTFS takes on a directory opened
    /// for writing and answers by writing the directory's metadata and its log. File systems
    /// that refuse it (FAT, some network redirectors: "access denied" or "invalid function")
    /// have nothing more to give: the mount warns once and goes on, each staging file and log
    /// still flushed itself before a record names it.
    pub fn sync(&self) -> io::Result<()> {
        #[cfg(unix)]
        return rustix::fs::fsync(&self.fd).map_err(io::Error::from);
        #[cfg(windows)]
        match self.hold.sync_all() {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(1 /* ERROR_INVALID_FUNCTION */ | 5 /* ERROR_ACCESS_DENIED */)
                ) =>
            {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    tracing::warn!(dir = %self.path.display(), error = %e, "this file system cannot flush a directory: after a power cut, files created or renamed in the cache directory just before it may be missing (use an NTFS --cache-dir)");
                });
                Ok(())
            }
            r => r,
        }
    }
}

impl At {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dir(&self) -> &Arc<Dir> {
        &self.dir
    }

    /// Another file of the same directory.
    pub fn sibling(&self, name: impl Into<String>) -> At {
        self.dir.at(name)
    }

    /// Where the file is, for messages.
    pub fn path(&self) -> PathBuf {
        self.dir.path.join(&self.name)
    }

    /// Opens the file, refusing a link in its place and anything but a regular file of ours.
    #[cfg(unix)]
    pub fn open(&self, how: Open) -> io::Result<File> {
        use rustix::fs::{fstat, openat, FileType, Mode, OFlags};
        // NONBLOCK: a FIFO in place of a file must not hang the open (it is refused below);
        // it changes nothing for a regular file.
        let mut flags = OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        flags |= match (how.read, how.write || how.append) {
            (true, true) => OFlags::RDWR,
            (false, true) => OFlags::WRONLY,
            _ => OFlags::RDONLY,
        };
        if how.append {
            flags |= OFlags::APPEND;
        }
        if how.create_new {
            flags |= OFlags::CREATE | OFlags::EXCL;
        } else if how.create {
            flags |= OFlags::CREATE;
        }
        let fd = openat(
            &self.dir.fd,
            self.name.as_str(),
            flags,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => refuse(Some(&self.path()), "it is a symbolic link"),
            e => io::Error::from(e),
        })?;
        let st = fstat(&fd)?;
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(refuse(Some(&self.path()), "it is not a regular file"));
        }
        if st.st_uid != me {
            return Err(refuse(
                Some(&self.path()),
                &format!("it belongs to user {}, not to us (user {me})", st.st_uid),
            ));
        }
        // Emptied only once it is known to be a file of ours.
        let file = File::from(fd);
        if how.truncate && st.st_size > 0 {
            self.freeing();
            file.set_len(0)?;
        }
        Ok(file)
    }

    /// Opens the file, refusing a link or junction in its place.
    #[cfg(windows)]
    pub fn open(&self, how: Open) -> io::Result<File> {
        let mut options = std::fs::OpenOptions::new();
        options
            .read(how.read)
            .write(how.write)
            .append(how.append)
            .create(how.create)
            .create_new(how.create_new);
        std::os::windows::fs::OpenOptionsExt::share_mode(&mut options, super::SHARE_ALL);
        let file =
            win::open_no_link(&super::verbatim(&self.path()), &options, 0).map_err(
                |e| match e {
                    win::Refused::Link => refuse(Some(&self.path()), "it is a link or junction"),
                    win::Refused::Io(e) => e,
                },
            )?;
        if !file.metadata()?.is_file() {
            return Err(refuse(Some(&self.path()), "it is not a regular file"));
        }
        if how.truncate {
            file.set_len(0)?;
        }
        Ok(file)
    }

    /// The whole file's bytes.
    pub fn read(&self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        io::Read::read_to_end(&mut self.open(Open::new().read(true))?, &mut out)?;
        Ok(out)
    }

    /// Replaces the file with `bytes`, durably: written to `<name>.tmp`, synced, renamed over
    /// it, and the directory synced.
    pub fn replace_with(&self, bytes: &[u8]) -> io::Result<()> {
        let tmp = self.sibling(format!("{}.tmp", self.name));
        let mut f = tmp.open(Open::new().write(true).create(true).truncate(true))?;
        io::Write::write_all(&mut f, bytes)?;
        f.sync_all()?;
        drop(f);
        tmp.rename_to(self)?;
        self.dir.sync()
    }

    /// Says the file is about to be cut shorter: runs the looks of [`Dir::before_freeing`].
    pub fn freeing(&self) {
        self.dir.freeing();
    }

    /// Removes the file.
    pub fn remove(&self) -> io::Result<()> {
        self.freeing();
        #[cfg(unix)]
        return rustix::fs::unlinkat(
            &self.dir.fd,
            self.name.as_str(),
            rustix::fs::AtFlags::empty(),
        )
        .map_err(io::Error::from);
        #[cfg(windows)]
        std::fs::remove_file(super::verbatim(&self.path()))
    }

    /// Renames the file to `to` (in this directory or another held one), replacing it.
    pub fn rename_to(&self, to: &At) -> io::Result<()> {
        // A file replaced is freed.
        to.freeing();
        #[cfg(unix)]
        return rustix::fs::renameat(
            &self.dir.fd,
            self.name.as_str(),
            &to.dir.fd,
            to.name.as_str(),
        )
        .map_err(io::Error::from);
        // Windows: std renames with MoveFileEx and, where that is refused (a target with
        // open handles), again with POSIX semantics if the file system has them (NTFS,
        // Windows 10 1809 and later). The directory's flush that follows makes the rename
        // durable ([`Dir::sync`]).
        #[cfg(windows)]
        std::fs::rename(super::verbatim(&self.path()), super::verbatim(&to.path()))
    }

    /// What the file is, not following a link in its place.
    pub fn stat(&self) -> io::Result<Stat> {
        #[cfg(unix)]
        {
            use rustix::fs::{statat, AtFlags, FileType};
            let st = statat(&self.dir.fd, self.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
            let kind = FileType::from_raw_mode(st.st_mode);
            let modified = SystemTime::UNIX_EPOCH
                .checked_add(std::time::Duration::new(
                    st.st_mtime.max(0) as u64,
                    st.st_mtime_nsec.clamp(0, 999_999_999) as u32,
                ))
                .unwrap_or(SystemTime::UNIX_EPOCH);
            Ok(Stat {
                len: st.st_size.max(0) as u64,
                is_file: kind == FileType::RegularFile,
                is_dir: kind == FileType::Directory,
                modified,
                disk_bytes: (st.st_blocks.max(0) as u64) * 512,
            })
        }
        #[cfg(windows)]
        {
            let p = super::verbatim(&self.path());
            let meta = std::fs::symlink_metadata(&p)?;
            // What a sparse file really takes (read-cache files are sparse): its allocation.
            let disk_bytes = match meta.is_file() {
                true => win::allocation(&std::fs::File::open(&p)?).unwrap_or(meta.len()),
                false => 0,
            };
            Ok(Stat {
                len: meta.len(),
                is_file: meta.is_file(),
                is_dir: meta.is_dir(),
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                disk_bytes,
            })
        }
    }
}

/// Windows: opening without following links, and what a handle tells.
#[cfg(windows)]
mod win {
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::os::windows::fs::OpenOptionsExt;
    use std::os::windows::io::AsRawHandle;
    use std::path::Path;
    use windows_sys::Win32::Storage::FileSystem::{
        FileAttributeTagInfo, FileStandardInfo, GetFileInformationByHandle,
        GetFileInformationByHandleEx, BY_HANDLE_FILE_INFORMATION, FILE_ATTRIBUTE_REPARSE_POINT,
        FILE_ATTRIBUTE_TAG_INFO, FILE_FLAG_OPEN_REPARSE_POINT, FILE_STANDARD_INFO,
    };

    pub enum Refused {
        Link,
        Io(io::Error),
    }

    impl From<io::Error> for Refused {
        fn from(e: io::Error) -> Self {
            Refused::Io(e)
        }
    }

    /// Fills a `T` by `GetFileInformationByHandleEx`.
    fn info<T>(f: &File, class: i32) -> io::Result<T> {
        // SAFETY: plain data the call fills in; `T` is the struct `class` asks for.
        let mut out: T = unsafe { std::mem::zeroed() };
        // SAFETY: `out` is as large as the class needs; the handle is open.
        let ok = unsafe {
            GetFileInformationByHandleEx(
                f.as_raw_handle(),
                class,
                (&mut out as *mut T).cast(),
                std::mem::size_of::<T>() as u32,
            )
        };
        if ok == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(out)
    }

    /// The volume and file index: which file a handle is on.
    fn identity(f: &File) -> io::Result<(u32, u32, u32)> {
        // SAFETY: plain data the call fills in.
        let mut i: BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
        // SAFETY: `i` is the struct the call fills; the handle is open.
        if unsafe { GetFileInformationByHandle(f.as_raw_handle(), &mut i) } == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((i.dwVolumeSerialNumber, i.nFileIndexHigh, i.nFileIndexLow))
    }

    /// Bytes the file takes on disk (a sparse file's allocation).
    pub fn allocation(f: &File) -> io::Result<u64> {
        Ok(info::<FILE_STANDARD_INFO>(f, FileStandardInfo)?.AllocationSize as u64)
    }

    /// Opens `path` with `options` (and `flags`), refusing a link: a reparse point whose tag
    /// is a name surrogate (symbolic links, junctions, mount points), the counterpart of
    /// `O_NOFOLLOW`. Other reparse points stand for the file itself (a deduplicated file, a
    /// OneDrive placeholder, a container layer's file): such a file is opened again with its
    /// filter's processing, which reads its real bytes, and must be the same file.
    pub fn open_no_link(path: &Path, options: &OpenOptions, flags: u32) -> Result<File, Refused> {
        let first = options
            .clone()
            .custom_flags(flags | FILE_FLAG_OPEN_REPARSE_POINT)
            .open(path)?;
        let tag = info::<FILE_ATTRIBUTE_TAG_INFO>(&first, FileAttributeTagInfo)?;
        if tag.FileAttributes & FILE_ATTRIBUTE_REPARSE_POINT == 0 {
            return Ok(first);
        }
        // IsReparseTagNameSurrogate.
        if tag.ReparseTag & 0x2000_0000 != 0 {
            return Err(Refused::Link);
        }
        let second = options
            .clone()
            .create(false)
            .create_new(false)
            .custom_flags(flags)
            .open(path)?;
        if identity(&second)? != identity(&first)? {
            return Err(Refused::Link);
        }
        Ok(second)
    }
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.path().display().fmt(f)
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A look registered for one directory's file system runs before a removal, a replacing
    /// rename or a cut in any held directory on it, and no longer once its owner drops it.
    #[test]
    fn a_free_on_the_file_system_runs_its_looks_first() {
        use std::cell::Cell;
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        thread_local! {
            /// Set on this test's thread: frees other tests make on the same file system at
            /// the same time run the look too, and are not counted.
            static OURS: Cell<bool> = const { Cell::new(false) };
        }
        OURS.with(|o| o.set(true));
        let base = tempfile::tempdir().unwrap();
        let watched = Dir::private(&base.path().join("a")).unwrap();
        let other = Dir::private(&base.path().join("b")).unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let look: Arc<FreeLook> = {
            let seen = seen.clone();
            Arc::new(move || {
                if OURS.with(|o| o.get()) {
                    seen.fetch_add(1, SeqCst);
                }
            })
        };
        watched.before_freeing(&look);
        other.at("f").replace_with(b"one").unwrap();
        let before = seen.load(SeqCst);
        other.at("g").replace_with(b"two").unwrap();
        assert!(seen.load(SeqCst) > before, "a file replaced by a rename");
        let before = seen.load(SeqCst);
        other.at("f").remove().unwrap();
        assert_eq!(seen.load(SeqCst), before + 1, "a removal");
        other
            .at("g")
            .open(Open::new().write(true).truncate(true))
            .unwrap();
        assert_eq!(seen.load(SeqCst), before + 2, "emptied at its open");
        other.at("g").freeing();
        assert_eq!(seen.load(SeqCst), before + 3, "a cut");
        drop(look);
        other.at("g").remove().unwrap();
        assert_eq!(seen.load(SeqCst), before + 3, "dropped: no look");
    }

    #[test]
    fn a_held_directory_swapped_for_another_is_not_followed() {
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("cache");
        let dir = Dir::private(&path).unwrap();
        dir.at("a").replace_with(b"ours").unwrap();
        // Someone moves the directory away and puts their own, with a planted file, in its
        // place: the mount still reads and writes its own.
        std::fs::rename(&path, base.path().join("moved")).unwrap();
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("a"), b"planted").unwrap();
        assert_eq!(dir.at("a").read().unwrap(), b"ours");
        dir.at("b").replace_with(b"new").unwrap();
        assert!(
            !path.join("b").exists(),
            "written into the swapped-in directory"
        );
        assert_eq!(std::fs::read(base.path().join("moved/b")).unwrap(), b"new");
    }

    #[test]
    fn a_link_or_a_fifo_in_place_of_a_file_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let dir = Dir::private(&base.path().join("d")).unwrap();
        let secret = base.path().join("secret");
        std::fs::write(&secret, b"root:x").unwrap();
        std::os::unix::fs::symlink(&secret, base.path().join("d/link")).unwrap();
        let e = dir.at("link").open(Open::new().read(true)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let e = dir
            .at("link")
            .open(Open::new().write(true).truncate(true))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert_eq!(std::fs::read(&secret).unwrap(), b"root:x");
        // A FIFO: refused at once, not waited on for a writer.
        let fifo = std::ffi::CString::new(base.path().join("d/fifo").to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let e = dir.at("fifo").open(Open::new().read(true)).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // Someone else's file (root can make one) is refused before it is emptied.
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = base.path().join("d/theirs");
            std::fs::write(&theirs, b"theirs").unwrap();
            std::os::unix::fs::chown(&theirs, Some(4321), None).unwrap();
            let e = dir
                .at("theirs")
                .open(Open::new().write(true).truncate(true))
                .unwrap_err();
            assert!(e.to_string().contains("belongs to user 4321"), "{e}");
            assert_eq!(std::fs::read(&theirs).unwrap(), b"theirs");
        }
        std::fs::create_dir(base.path().join("d/sub")).unwrap();
        let e = dir.at("sub").open(Open::new().read(true)).unwrap_err();
        assert!(e.to_string().contains("directory") || e.kind() == io::ErrorKind::PermissionDenied);
        assert!(!dir.at("link").stat().unwrap().is_file);
    }

    #[test]
    fn a_private_directory_is_narrowed_and_a_link_to_one_refused() {
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("d");
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let dir = Dir::private(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::os::unix::fs::symlink(&path, base.path().join("l")).unwrap();
        let e = Dir::private(&base.path().join("l")).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::os::unix::fs::symlink(&path, path.join("loop")).unwrap();
        let e = dir.child("loop").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let sub = dir.child("sub").unwrap();
        sub.at("x").replace_with(b"1").unwrap();
        let mut names = sub.names().unwrap();
        names.sort();
        assert_eq!(names, vec![OsString::from("x")]);
    }
}

#[cfg(test)]
mod portable_tests {
    use super::*;

    /// A cache directory deeper than Windows' MAX_PATH (260 characters): a default one under a
    /// long profile path for a long bucket name gets there. Every call below takes it (on
    /// Windows through `\\?\` paths). Wine does not enforce MAX_PATH, so there this only shows
    /// the calls work with such paths; docs/windows.md's checklist has it for Windows.
    #[test]
    fn a_directory_deeper_than_max_path_works() {
        let base = tempfile::tempdir().unwrap();
        let mut path = base.path().to_path_buf();
        for i in 0..6 {
            path.push(format!("{i}{}", "d".repeat(60)));
        }
        assert!(path.as_os_str().len() > 300);
        let dir = Dir::private(&path).unwrap();
        let sub = dir.child("staging").unwrap();
        let a = sub.at("0000000000000001.data");
        a.replace_with(b"long").unwrap();
        let b = sub.at("0000000000000002.data");
        a.rename_to(&b).unwrap();
        assert_eq!(b.read().unwrap(), b"long");
        assert_eq!(b.stat().unwrap().len, 4);
        assert_eq!(sub.names().unwrap().len(), 1);
        sub.sync().unwrap();
        b.remove().unwrap();
        assert!(sub.names().unwrap().is_empty());
    }

    /// A file another handle holds open can be renamed and removed, as on Unix: the staging
    /// pool recycles files an upload may still read, and the read cache retires files a reader
    /// holds (Windows: every open shares delete access).
    #[test]
    fn an_open_file_can_be_renamed_and_removed() {
        let base = tempfile::tempdir().unwrap();
        let dir = Dir::private(base.path()).unwrap();
        let a = dir.at("a");
        a.replace_with(b"held").unwrap();
        let held = a.open(Open::new().read(true)).unwrap();
        let b = dir.at("b");
        a.rename_to(&b).unwrap();
        b.remove().unwrap();
        let mut got = Vec::new();
        io::Read::read_to_end(&mut &held, &mut got).unwrap();
        assert_eq!(got, b"held", "the open handle still reads the file");
        // The name is free again once renamed away and removed.
        dir.at("a").replace_with(b"new").unwrap();
        assert_eq!(dir.at("a").read().unwrap(), b"new");
    }
}

#[cfg(all(test, windows))]
mod windows_tests {
    use super::*;

    /// A symbolic link in place of a cache file is never followed, as `O_NOFOLLOW` refuses
    /// it on Unix: its target is neither read nor emptied. (Windows refuses it as a link;
    /// Wine keeps such a link as a Unix one that its own opens of it do not resolve, so only
    /// the failure is checked here.)
    #[test]
    fn a_link_in_place_of_a_file_is_not_followed() {
        let base = tempfile::tempdir().unwrap();
        let dir = Dir::private(&base.path().join("d")).unwrap();
        let secret = base.path().join("secret");
        std::fs::write(&secret, b"secret").unwrap();
        std::os::windows::fs::symlink_file(&secret, base.path().join("d").join("link")).unwrap();
        assert!(dir.at("link").open(Open::new().read(true)).is_err());
        assert!(dir.at("link").read().is_err());
        let truncating = Open::new().write(true).truncate(true);
        assert!(dir.at("link").open(truncating).is_err());
        assert_eq!(std::fs::read(&secret).unwrap(), b"secret");
    }

    /// Windows' form of Unix's held descriptor: while the mount holds its directory, nobody
    /// can rename or remove it, so its path keeps leading to it.
    #[test]
    fn a_held_directory_cannot_be_renamed_or_removed() {
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("cache");
        let dir = Dir::private(&path).unwrap();
        dir.at("a").replace_with(b"ours").unwrap();
        let empty = dir.child("empty").unwrap();
        assert!(std::fs::rename(&path, base.path().join("moved")).is_err());
        assert!(std::fs::remove_dir(path.join("empty")).is_err());
        // Windows also renames no directory above it (none with open handles below); Wine
        // does, so that is on docs/windows.md's checklist instead.
        assert_eq!(dir.at("a").read().unwrap(), b"ours");
        drop((dir, empty));
        std::fs::remove_dir(path.join("empty")).unwrap();
        std::fs::rename(&path, base.path().join("moved")).unwrap();
    }
}
