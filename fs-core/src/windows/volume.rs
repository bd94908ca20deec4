//! The Windows view of a mounted bucket: path-based calls in the shape of WinFsp's callbacks,
//! on top of the inode-based [`Filesystem`].
//!
//! Windows names files by path, case-insensitively, and drives a file through a handle's life:
//! open or create, overwrite, set the size or allocation, write (often out of order), set times,
//! flush, mark for deletion, clean up (the last `CloseHandle`), close. Every decision about
//! that life is made here, so it is tested on Linux against the in-memory store; the WinFsp
//! adapter only converts buffers, strings and status codes.
//!
//! - **Names.** A Windows path maps component by component to object names: first the exact
//!   object name ([`names::from_windows`]), then, if there is none, a case-insensitive match
//!   among the directory's Windows names ([`names::directory_names`]), compared through one
//!   folding ([`names::fold`]). A directory's names are listed once and kept for the negative
//!   TTL, so repeated misses such as Explorer's `desktop.ini` probes cost no request. This
//!   volume's own creates, renames and deletes edit the kept listing in place rather than
//!   dropping it: WinFsp runs those calls under its volume-wide exclusive lock, and a copy of N
//!   files into a folder must not cost N listings of it.
//! - **Canonical names.** Open and create return the path as the directory shows it
//!   (`\DOCS\BUDGET.XLSX` opens `\Docs\Budget.xlsx`). WinFsp keeps that as the open file's
//!   name; without it a case-insensitive volume keeps the upper-cased name, and a case-only
//!   rename then looks like no change at all.
//! - **Enumeration.** A new enumeration lists the directory afresh; each call returns a bounded
//!   page after the marker, found by a search in the sorted listing, so a folder of N entries
//!   costs O(N log N) however small the caller's buffer. WinFsp applies the wildcard pattern
//!   itself, with Windows' own rules.
//! - **Handles.** Opening resolves the name only. A core file handle for reading is taken on
//!   the first read, and one for writing on the first change, so the many opens Explorer makes
//!   to read attributes cost nothing and never stage a file.
//! - **Cleanup is close.** Windows' cleanup (the last user handle closed) is where written data
//!   becomes durable and its upload is scheduled, and where a delete-pending file is deleted.

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;
use std::time::SystemTime;

use self::listing::{shown, utf16_len, Age, Edit, Kept, Listing};
use super::names::{directory_names, fold, from_windows, to_windows};
use super::{attributes, from_filetime, to_filetime};
use crate::error::{FsError, FsResult};
use crate::filesystem::{CreateFlags, Filesystem, OpenMode, TEMP_DIR};
use crate::namespace::{Attr, Ino, Kind, ROOT_INO};
use crate::store::ObjectStore;

/// Longest path Windows programs get from us, in UTF-16 units; longer names are not shown.
pub const MAX_PATH_UNITS: usize = 1024;
/// Longest single name, in UTF-16 units (what NTFS and WinFsp's directory entries hold).
pub const MAX_NAME_UNITS: usize = 255;
/// Allocation unit reported to Windows.
const CLUSTER: u64 = 4096;
/// Most entries one [`Volume::read_directory`] call returns. The adapter asks again after the
/// last one while the caller's buffer has room.
pub const DIR_PAGE: usize = 256;

/// File information as Windows wants it: FILETIMEs, attributes, sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WinInfo {
    pub attributes: u32,
    pub file_size: u64,
    pub allocation_size: u64,
    pub creation_time: u64,
    pub last_access_time: u64,
    pub last_write_time: u64,
    pub change_time: u64,
    pub index_number: u64,
}

/// An opened file: its handle, its information, and its path as the directories show it.
pub struct Opened {
    pub handle: WinHandle,
    pub info: WinInfo,
    /// The canonical Windows path (`\Docs\Budget.xlsx`), for WinFsp's normalized name.
    pub name: String,
}

/// One directory entry under its Windows name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WinEntry {
    pub name: String,
    pub info: WinInfo,
}

/// Sizes and label for `get_volume_info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStats {
    pub total_size: u64,
    pub free_size: u64,
    pub label: String,
}

/// What `open` and `create` are asked for, from the Windows create options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// `FILE_DIRECTORY_FILE`: only a directory will do.
    pub directory: bool,
    /// `FILE_NON_DIRECTORY_FILE`: only a file will do.
    pub non_directory: bool,
    /// `FILE_DELETE_ON_CLOSE`: the handle deletes the file when it is closed. WinFsp marks the
    /// deletion at cleanup without asking [`Volume::set_delete`] first, so a non-empty
    /// directory is refused here, as FAT and NTFS refuse it.
    pub delete_on_close: bool,
    /// The disposition is `FILE_CREATE` (`CREATE_NEW`): the program asked for a new name, not
    /// for whatever the name holds (`FILE_OPEN_IF` and `FILE_OVERWRITE_IF` reach create too,
    /// once the name was not found). WinFsp passes the disposition in the options' top byte.
    pub create_new: bool,
}

/// Windows create-option bits the volume understands.
pub const FILE_DIRECTORY_FILE: u32 = 0x0000_0001;
pub const FILE_NON_DIRECTORY_FILE: u32 = 0x0000_0040;
pub const FILE_DELETE_ON_CLOSE: u32 = 0x0000_1000;
/// The create disposition `FILE_CREATE`, in the create options' top byte.
pub const FILE_CREATE: u32 = 0x0000_0002;

impl OpenOptions {
    pub fn from_create_options(create_options: u32) -> Self {
        OpenOptions {
            directory: create_options & FILE_DIRECTORY_FILE != 0,
            non_directory: create_options & FILE_NON_DIRECTORY_FILE != 0,
            delete_on_close: create_options & FILE_DELETE_ON_CLOSE != 0,
            create_new: (create_options >> 24) & 0xff == FILE_CREATE,
        }
    }
}

#[derive(Default)]
struct HandleIo {
    reader: Option<u64>,
    writer: Option<u64>,
    /// Allocation size set by the program; only reported back.
    allocation: Option<u64>,
}

/// One open file or directory (WinFsp's file context).
pub struct WinHandle {
    ino: Ino,
    kind: Kind,
    io: tokio::sync::Mutex<HandleIo>,
}

impl WinHandle {
    pub fn ino(&self) -> Ino {
        self.ino
    }

    pub fn is_dir(&self) -> bool {
        self.kind == Kind::Dir
    }
}

/// How long a directory's Windows path is with the separator after it, in UTF-16 units: what
/// a name in it adds to. `\` at the root, `\a\b\` for `a/b`.
fn dir_units(dir_path: &str) -> usize {
    1 + dir_path
        .split('/')
        .filter(|c| !c.is_empty())
        .map(|c| utf16_len(&to_windows(c)) + 1)
        .sum::<usize>()
}

/// The name WinFsp keeps for a path component asked for as `asked`: the first of `shown` (how
/// the folder shows the object, best first) that differs from `asked` only by case, else
/// `asked` as typed. WinFsp refuses a normalized name that differs otherwise, and an object
/// may be reached by a name it is not shown under: its exact object name when a case twin
/// holds the plain name, or a quote typed where the mapping would put none.
fn canonical<'a>(asked: &str, shown: impl IntoIterator<Item = &'a str>) -> String {
    let key = fold(asked);
    shown
        .into_iter()
        .find(|s| fold(s) == key)
        .unwrap_or(asked)
        .to_string()
}

/// One page of a directory enumeration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirPage {
    pub entries: Vec<WinEntry>,
    /// No entries follow these.
    pub end: bool,
}

/// Splits a Windows path (`\dir\file`) into its components.
fn components(win_path: &str) -> Vec<&str> {
    win_path
        .split(['\\', '/'])
        .filter(|c| !c.is_empty())
        .collect()
}

/// The Windows view of one mounted [`Filesystem`].
pub struct Volume<S: ObjectStore> {
    fs: Arc<Filesystem<S>>,
    label: String,
    listings: Kept,
}

impl<S: ObjectStore> Volume<S> {
    /// `label` is the volume label Explorer shows: the bucket name.
    pub fn new(fs: Arc<Filesystem<S>>, label: &str) -> Self {
        // A listing answers "no such name in any case", so it lives as long as a negative
        // entry does.
        let listings = Kept::new(fs.config().negative_ttl);
        Volume {
            fs,
            label: label.to_string(),
            listings,
        }
    }

    pub fn filesystem(&self) -> &Arc<Filesystem<S>> {
        &self.fs
    }

    pub fn is_read_only(&self) -> bool {
        self.fs.is_read_only()
    }

    pub fn volume_stats(&self) -> VolumeStats {
        let st = self.fs.statfs();
        let free = (st.blocks_free * u64::from(st.block_size)).max(CLUSTER);
        VolumeStats {
            total_size: (st.blocks * u64::from(st.block_size)).max(free),
            free_size: free,
            label: self.label.clone(),
        }
    }

    /// How Windows sees `attr`.
    pub fn info(&self, attr: &Attr, allocation: Option<u64>) -> WinInfo {
        let t = to_filetime(attr.mtime);
        let size = if attr.kind == Kind::Dir { 0 } else { attr.size };
        WinInfo {
            attributes: attributes(attr.kind, self.is_read_only()),
            file_size: size,
            allocation_size: allocation
                .unwrap_or(0)
                .max(size.div_ceil(CLUSTER) * CLUSTER),
            creation_time: t,
            last_access_time: t,
            last_write_time: t,
            change_time: t,
            index_number: attr.ino,
        }
    }

    // ----- names -----

    fn object_path(&self, ino: Ino) -> FsResult<String> {
        Ok(self.fs.namespace().inode_path(ino)?.0)
    }

    /// The object path's parent directory path and last name.
    fn split(path: &str) -> (&str, &str) {
        match path.rfind('/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => ("", path),
        }
    }

    fn forget_listing(&self, dir_path: &str) {
        self.listings.edit(dir_path, Edit::Drop);
    }

    /// `object` appeared in `dir_path` (created, or renamed there).
    fn listed(&self, dir_path: &str, object: &str, attr: &Attr) {
        if dir_path.is_empty() && object == TEMP_DIR {
            return;
        }
        let edit = Edit::Insert {
            dir_units: dir_units(dir_path),
            object: object.to_string(),
            attr: attr.clone(),
        };
        self.listings.edit(dir_path, edit);
    }

    /// `object` left `dir_path` (deleted, or renamed away).
    fn unlisted(&self, dir_path: &str, object: &str) {
        self.listings
            .edit(dir_path, Edit::Remove(object.to_string()));
    }

    /// The Windows names of directory `dir` (an inode the caller holds). Callers keep the
    /// result only for the call at hand: edits replace the kept copy.
    async fn listing(&self, dir: Ino, age: Age) -> FsResult<Arc<Listing>> {
        let dir_path = self.object_path(dir)?;
        if let Some(l) = self.listings.get(&dir_path, age) {
            return Ok(l);
        }
        let build = self.listings.begin(&dir_path);
        let fh = self.fs.opendir(dir).await?.fh;
        let mut found = Vec::new();
        let mut offset = 0;
        let result = loop {
            match self.fs.readdir(fh, offset).await {
                Ok(batch) if batch.is_empty() => break Ok(()),
                Ok(batch) => {
                    for e in batch {
                        offset = e.offset;
                        if e.name == "." || e.name == ".." {
                            continue;
                        }
                        // Entries are registered with no reference; take and drop one so the
                        // inode table does not keep them.
                        self.fs.remember(e.attr.ino);
                        self.fs.forget(e.attr.ino, 1);
                        found.push((e.name, e.attr));
                    }
                }
                Err(e) => break Err(e),
            }
        };
        self.fs.releasedir(fh);
        result?;
        let units = dir_units(&dir_path);
        let mut attrs: HashMap<String, Attr> = found.into_iter().collect();
        let mut names = Vec::with_capacity(attrs.len());
        let all = directory_names(attrs.keys().map(String::as_str));
        // Counted before names too long to show are left out: their suffix still depends on
        // the names that are shown.
        let suffixed = all.iter().any(|(object, win)| *win != to_windows(object));
        for (object, win) in all {
            if !shown(units, &win) {
                tracing::warn!(
                    name = %object, dir = %dir_path,
                    "name too long for Windows ({} UTF-16 units in a {units}-unit directory); not shown",
                    utf16_len(&win)
                );
                continue;
            }
            if dir_path.is_empty() && object == TEMP_DIR {
                continue;
            }
            if let Some(attr) = attrs.remove(&object) {
                names.push((object, win, attr));
            }
        }
        Ok(build.finish(Listing::new(names, suffixed)))
    }

    /// Looks `win_name` up in directory `dir`: the exact object name first, then a
    /// case-insensitive match among the directory's Windows names. Returns the entry and the
    /// name the directory shows it under; the caller owns one reference to the inode.
    async fn child(&self, dir: Ino, win_name: &str) -> FsResult<(Attr, String)> {
        if utf16_len(win_name) > MAX_NAME_UNITS {
            return Err(FsError::InvalidName(win_name.to_string()));
        }
        let object = from_windows(win_name);
        match self.fs.lookup(dir, &object).await {
            Ok(attr) => {
                // The shown name differs from the plain mapping only under a case suffix,
                // which a kept listing knows; no listing is made just to ask.
                let dir_path = self.object_path(dir)?;
                let kept = self.listings.get(&dir_path, Age::Fresh);
                let listed = kept.as_deref().and_then(|l| l.win_of(&object));
                let plain = to_windows(&object);
                let name = canonical(win_name, listed.into_iter().chain([plain.as_str()]));
                return Ok((attr, name));
            }
            Err(FsError::NotFound) | Err(FsError::InvalidName(_)) => {}
            Err(e) => return Err(e),
        }
        let found = self
            .listing(dir, Age::Fresh)
            .await?
            .object_of(win_name)
            .filter(|n| n.object != object)
            .map(|n| (n.object.clone(), n.win.clone()));
        match found {
            Some((name, win)) => Ok((self.fs.lookup(dir, &name).await?, win)),
            None => Err(FsError::NotFound),
        }
    }

    /// Resolves a whole Windows path; the caller owns one reference to the result. Returns
    /// the path as the directories show it. A missing last name is `NotFound`; a missing
    /// directory, or a file, on the way is `PathNotFound`, which programs tell apart
    /// (`ERROR_PATH_NOT_FOUND`, say, makes them create the folder).
    async fn resolve(&self, win_path: &str) -> FsResult<(Attr, String)> {
        if utf16_len(win_path) > MAX_PATH_UNITS {
            return Err(FsError::InvalidName(win_path.to_string()));
        }
        let comps = components(win_path);
        let mut attr = self.fs.getattr(ROOT_INO).await?;
        let mut canonical = String::with_capacity(win_path.len() + 1);
        for (i, comp) in comps.iter().enumerate() {
            if attr.kind != Kind::Dir {
                self.fs.forget(attr.ino, 1);
                return Err(FsError::PathNotFound);
            }
            let next = self.child(attr.ino, comp).await;
            self.fs.forget(attr.ino, 1);
            let (found, shown) = match next {
                Err(FsError::NotFound) if i + 1 < comps.len() => return Err(FsError::PathNotFound),
                other => other?,
            };
            canonical.push('\\');
            canonical.push_str(&shown);
            attr = found;
        }
        if canonical.is_empty() {
            canonical.push('\\');
        }
        Ok((attr, canonical))
    }

    /// Resolves the parent of a Windows path and maps its last name; the caller owns one
    /// reference to the parent. Also returns the parent's path as the directories show it.
    async fn resolve_parent<'p>(&self, win_path: &'p str) -> FsResult<(Attr, String, &'p str)> {
        let trimmed = win_path.trim_end_matches(['\\', '/']);
        let (dir, last) = match trimmed.rfind(['\\', '/']) {
            Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
            None => ("", trimmed),
        };
        if last.is_empty() {
            return Err(FsError::InvalidName(win_path.to_string()));
        }
        let (parent, canonical) = match self.resolve(dir).await {
            Err(FsError::NotFound) => return Err(FsError::PathNotFound),
            other => other?,
        };
        if parent.kind != Kind::Dir {
            self.fs.forget(parent.ino, 1);
            return Err(FsError::PathNotFound);
        }
        Ok((parent, canonical, last))
    }

    /// The parent inode of an object path, by exact names; the caller owns one reference.
    async fn parent_of(&self, path: &str) -> FsResult<Ino> {
        let (dir, _) = Self::split(path);
        // The root is never forgotten, so it needs no reference of its own.
        let mut ino = ROOT_INO;
        for comp in dir.split('/').filter(|c| !c.is_empty()) {
            let next = self.fs.lookup(ino, comp).await;
            self.fs.forget(ino, 1);
            ino = next?.ino;
        }
        Ok(ino)
    }

    // ----- the handle's life -----

    /// Attributes for `get_security_by_name`: what is at `win_path`.
    pub async fn attributes_of(&self, win_path: &str) -> FsResult<u32> {
        let (attr, _) = self.resolve(win_path).await?;
        self.fs.forget(attr.ino, 1);
        Ok(attributes(attr.kind, self.is_read_only()))
    }

    /// Opens an existing file or directory. Nothing is fetched or staged yet. Also returns
    /// the path as the directories show it, which WinFsp keeps as the file's name.
    pub async fn open(&self, win_path: &str, opts: OpenOptions) -> FsResult<Opened> {
        let (attr, canonical) = self.resolve(win_path).await?;
        let refuse = match attr.kind {
            Kind::Dir if opts.non_directory => Some(FsError::IsDir),
            Kind::File | Kind::Symlink if opts.directory => Some(FsError::NotDir),
            Kind::Dir if opts.delete_on_close => self.refuse_delete(attr.ino).await.err(),
            _ => None,
        };
        if let Some(e) = refuse {
            self.fs.forget(attr.ino, 1);
            return Err(e);
        }
        let info = self.info(&attr, None);
        Ok(Opened {
            handle: WinHandle {
                ino: attr.ino,
                kind: attr.kind,
                io: tokio::sync::Mutex::new(HandleIo::default()),
            },
            info,
            name: canonical,
        })
    }

    /// Whether directory `dir` may be deleted: not the root, and nothing in it now.
    async fn refuse_delete(&self, dir: Ino) -> FsResult<()> {
        if self.is_read_only() {
            return Err(FsError::ReadOnly);
        }
        if dir == ROOT_INO {
            return Err(FsError::PermissionDenied(
                "the root cannot be deleted".into(),
            ));
        }
        if !self.listing(dir, Age::Now).await?.entries.is_empty() {
            return Err(FsError::NotEmpty);
        }
        Ok(())
    }

    /// Creates a new file or directory. A name that exists in any case is a collision.
    pub async fn create(
        &self,
        win_path: &str,
        opts: OpenOptions,
        allocation_size: u64,
    ) -> FsResult<Opened> {
        let (parent, parent_name, win_name) = self.resolve_parent(win_path).await?;
        let result = self
            .create_in(&parent, win_name, opts, allocation_size)
            .await;
        self.fs.forget(parent.ino, 1);
        let (handle, info, shown) = result?;
        let sep = if parent_name.ends_with('\\') {
            ""
        } else {
            "\\"
        };
        Ok(Opened {
            handle,
            info,
            name: format!("{parent_name}{sep}{shown}"),
        })
    }

    async fn create_in(
        &self,
        parent: &Attr,
        win_name: &str,
        opts: OpenOptions,
        allocation_size: u64,
    ) -> FsResult<(WinHandle, WinInfo, String)> {
        match self.child(parent.ino, win_name).await {
            Ok((existing, _)) => {
                self.fs.forget(existing.ino, 1);
                return Err(FsError::Exists);
            }
            Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        let name = from_windows(win_name);
        let parent_path = self.object_path(parent.ino)?;
        let shown = canonical(win_name, [to_windows(&name).as_str()]);
        let made = if opts.directory {
            self.fs
                .mkdir(parent.ino, &name)
                .await
                .map(|attr| (attr, None))
        } else {
            let flags = CreateFlags {
                exclusive: opts.create_new,
                mode: None,
                // Windows sends one cleanup per file object, after its last handle (copies a
                // child inherited included) is closed: every cleanup is the writer's own.
                process: None,
            };
            let created = self.fs.create_with(parent.ino, &name, flags).await;
            created.map(|(attr, opened)| (attr, Some(opened.fh)))
        };
        let (attr, writer) = match made {
            Ok(made) => made,
            Err(e) => {
                // It may have been made although the answer was lost.
                self.forget_listing(&parent_path);
                return Err(e);
            }
        };
        self.listed(&parent_path, &name, &attr);
        let allocation = (allocation_size > 0 && !opts.directory).then_some(allocation_size);
        let info = self.info(&attr, allocation);
        let handle = WinHandle {
            ino: attr.ino,
            kind: attr.kind,
            io: tokio::sync::Mutex::new(HandleIo {
                writer,
                allocation,
                ..HandleIo::default()
            }),
        };
        Ok((handle, info, shown))
    }

    /// Overwrite or supersede of an open file: it becomes empty (the program writes it anew).
    pub async fn overwrite(&self, h: &WinHandle, allocation_size: u64) -> FsResult<WinInfo> {
        if h.is_dir() {
            return Err(FsError::IsDir);
        }
        let mut io = h.io.lock().await;
        match io.writer {
            Some(fh) => {
                self.fs.setattr(h.ino, Some(0), None, Some(fh)).await?;
            }
            None => {
                self.writer(h, &mut io, true).await?;
            }
        }
        io.allocation = (allocation_size > 0).then_some(allocation_size);
        let attr = self.fs.getattr(h.ino).await?;
        Ok(self.info(&attr, io.allocation))
    }

    pub async fn file_info(&self, h: &WinHandle) -> FsResult<WinInfo> {
        let io = h.io.lock().await;
        let attr = self.fs.getattr(h.ino).await?;
        Ok(self.info(&attr, io.allocation))
    }

    /// The core handle for writing, taken on the first change (`truncate`: opened empty).
    async fn writer(&self, h: &WinHandle, io: &mut HandleIo, truncate: bool) -> FsResult<u64> {
        if h.is_dir() {
            return Err(FsError::IsDir);
        }
        if let Some(fh) = io.writer {
            return Ok(fh);
        }
        let opened = self
            .fs
            .open(
                h.ino,
                OpenMode {
                    write: true,
                    truncate,
                    process: None,
                },
            )
            .await?;
        io.writer = Some(opened.fh);
        Ok(opened.fh)
    }

    /// Reads at `offset`. At or past the end of the file this is `EndOfFile`, as Windows wants.
    pub async fn read(&self, h: &WinHandle, offset: u64, len: u32) -> FsResult<bytes::Bytes> {
        if h.is_dir() {
            return Err(FsError::IsDir);
        }
        let mut io = h.io.lock().await;
        let fh = match (io.writer, io.reader) {
            (Some(fh), _) | (None, Some(fh)) => fh,
            (None, None) => {
                let opened = self.fs.open(h.ino, OpenMode::default()).await?;
                io.reader = Some(opened.fh);
                opened.fh
            }
        };
        drop(io);
        let data = self.fs.read(fh, offset, len).await?;
        if data.is_empty() && len > 0 {
            return Err(FsError::EndOfFile);
        }
        Ok(data)
    }

    /// Writes `data`. `write_to_eof` appends; `constrained` (paging I/O) never extends the file.
    pub async fn write(
        &self,
        h: &WinHandle,
        offset: u64,
        data: &[u8],
        write_to_eof: bool,
        constrained: bool,
    ) -> FsResult<(u32, WinInfo)> {
        // The handle's lock only guards taking the writer: Explorer keeps several writes of
        // one handle in flight, and the core orders them itself.
        let (fh, allocation) = {
            let mut io = h.io.lock().await;
            (self.writer(h, &mut io, false).await?, io.allocation)
        };
        let mut offset = offset;
        let mut data = data;
        if write_to_eof || constrained {
            let size = self.fs.getattr(h.ino).await?.size;
            if write_to_eof {
                offset = size;
            }
            if constrained {
                if offset >= size {
                    let attr = self.fs.getattr(h.ino).await?;
                    return Ok((0, self.info(&attr, allocation)));
                }
                data = &data[..data.len().min((size - offset) as usize)];
            }
        }
        let n = self.fs.write(fh, offset, data).await?;
        let attr = self.fs.getattr(h.ino).await?;
        Ok((n, self.info(&attr, allocation)))
    }

    /// `SetEndOfFile` (`allocation` false) or an allocation size (`allocation` true). An
    /// allocation is a hint only, except that one below the file size cuts the file, as on
    /// NTFS.
    pub async fn set_file_size(
        &self,
        h: &WinHandle,
        size: u64,
        allocation: bool,
    ) -> FsResult<WinInfo> {
        let mut io = h.io.lock().await;
        let current = self.fs.getattr(h.ino).await?;
        if allocation {
            io.allocation = Some(size);
            if size >= current.size {
                return Ok(self.info(&current, io.allocation));
            }
        }
        if size != current.size {
            let fh = self.writer(h, &mut io, false).await?;
            self.fs.setattr(h.ino, Some(size), None, Some(fh)).await?;
        }
        let attr = self.fs.getattr(h.ino).await?;
        Ok(self.info(&attr, io.allocation))
    }

    /// Times and attributes. The last-write time is stored as the object's mtime (the same
    /// metadata Linux uses); 0 means "leave it". Other times and attributes are accepted and
    /// not stored: a bucket has nowhere to keep them.
    pub async fn set_basic_info(&self, h: &WinHandle, last_write_time: u64) -> FsResult<WinInfo> {
        let io = h.io.lock().await;
        if last_write_time != 0 && last_write_time != u64::MAX && !h.is_dir() {
            let t: SystemTime = from_filetime(last_write_time);
            self.fs.setattr(h.ino, None, Some(t), io.writer).await?;
        }
        let attr = self.fs.getattr(h.ino).await?;
        Ok(self.info(&attr, io.allocation))
    }

    /// `FlushFileBuffers`: the file's data becomes durable on the local disk and its upload is
    /// scheduled, as `close()` does on Linux. It does not wait for the bucket: Office flushes
    /// on every save, and a save must neither stall on the network nor fail while the network
    /// is down, since the staged bytes are already safe.
    pub async fn flush(&self, h: &WinHandle) -> FsResult<WinInfo> {
        let io = h.io.lock().await;
        if let Some(fh) = io.writer {
            self.fs.flush(fh).await?;
        }
        let attr = self.fs.getattr(h.ino).await?;
        Ok(self.info(&attr, io.allocation))
    }

    /// Whether the file or directory may be deleted (WinFsp's set_delete, and the check for
    /// `FILE_DELETE_ON_CLOSE`). The deletion itself happens at [`Self::cleanup`].
    pub async fn set_delete(&self, h: &WinHandle, delete: bool) -> FsResult<()> {
        if !delete {
            return Ok(());
        }
        if self.is_read_only() {
            return Err(FsError::ReadOnly);
        }
        if h.is_dir() {
            self.refuse_delete(h.ino).await?;
        }
        Ok(())
    }

    /// The last user handle was closed. Written data becomes durable and its upload is
    /// scheduled; with `delete` (the file was marked for deletion) it is deleted instead.
    /// A directory is deleted only if it is empty now: a delete-on-close handle reaches here
    /// without [`Self::set_delete`]'s check, and things may have appeared in it since.
    pub async fn cleanup(&self, h: &WinHandle, delete: bool) -> FsResult<()> {
        let mut io = h.io.lock().await;
        if !delete {
            if let Some(fh) = io.writer {
                return self.fs.flush(fh).await;
            }
            return Ok(());
        }
        if h.is_dir() {
            self.refuse_delete(h.ino).await?;
        }
        // Deleted data need not be saved: drop the handles first, then the name.
        for fh in [io.writer.take(), io.reader.take()].into_iter().flatten() {
            self.fs.release(fh).await;
        }
        let path = self.object_path(h.ino)?;
        let (dir, name) = Self::split(&path);
        let parent = self.parent_of(&path).await?;
        let result = if h.is_dir() {
            self.fs.rmdir(parent, name).await
        } else {
            self.fs.unlink(parent, name).await
        };
        self.fs.forget(parent, 1);
        match &result {
            Ok(()) | Err(FsError::NotFound) => self.unlisted(dir, name),
            Err(_) => self.forget_listing(dir),
        }
        if h.is_dir() {
            self.listings.drop_tree(&path);
        }
        match result {
            Err(FsError::NotFound) => Ok(()),
            other => other,
        }
    }

    /// The handle is gone: release what it holds. Writes that arrived after cleanup (paging
    /// I/O can) are committed first, so nothing is left unsaved; with none, this is free.
    pub async fn close(&self, h: WinHandle) {
        let mut io = h.io.lock().await;
        if let Some(fh) = io.writer {
            if let Err(e) = self.fs.flush(fh).await {
                tracing::warn!(ino = h.ino, error = %e, "saving late writes at close failed");
            }
        }
        for fh in [io.writer.take(), io.reader.take()].into_iter().flatten() {
            self.fs.release(fh).await;
        }
        self.fs.forget(h.ino, 1);
    }

    /// Renames the handle's file or directory to `new_win_path`. An existing target is an
    /// error unless `replace`; a directory is never replaced. A target that exists under a
    /// different case is replaced under its existing name. Changing only the case of a name
    /// is a rename.
    pub async fn rename(&self, h: &WinHandle, new_win_path: &str, replace: bool) -> FsResult<()> {
        let from = self.object_path(h.ino)?;
        let (parent, _, win_name) = self.resolve_parent(new_win_path).await?;
        let result = self.rename_into(h, &from, &parent, win_name, replace).await;
        self.fs.forget(parent.ino, 1);
        result
    }

    async fn rename_into(
        &self,
        h: &WinHandle,
        from: &str,
        parent: &Attr,
        win_name: &str,
        replace: bool,
    ) -> FsResult<()> {
        let mut to_name = from_windows(win_name);
        match self.child(parent.ino, win_name).await {
            Ok((existing, _)) => {
                let existing_path = self.object_path(existing.ino);
                self.fs.forget(existing.ino, 1);
                let existing_path = existing_path?;
                if existing.ino != h.ino && existing_path != from {
                    if !replace {
                        return Err(FsError::Exists);
                    }
                    if existing.kind == Kind::Dir {
                        return Err(FsError::PermissionDenied(
                            "a directory cannot be replaced".into(),
                        ));
                    }
                    to_name = Self::split(&existing_path).1.to_string();
                }
            }
            Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        let (from_dir, from_name) = Self::split(from);
        let to_dir = self.object_path(parent.ino)?;
        if from_dir == to_dir && from_name == to_name {
            return Ok(());
        }
        let from_parent = self.parent_of(from).await?;
        let result = self
            .fs
            .rename(from_parent, from_name, parent.ino, &to_name)
            .await;
        self.fs.forget(from_parent, 1);
        match &result {
            Ok(()) => {
                self.unlisted(from_dir, from_name);
                match self.fs.getattr(h.ino).await {
                    Ok(attr) => self.listed(&to_dir, &to_name, &attr),
                    Err(_) => self.forget_listing(&to_dir),
                }
            }
            Err(_) => {
                // Part of a folder's move may have happened: list both again.
                self.forget_listing(from_dir);
                self.forget_listing(&to_dir);
            }
        }
        if h.is_dir() {
            self.listings.drop_tree(from);
        }
        result
    }

    /// One page of an enumeration: at most [`DIR_PAGE`] entries in Windows order after
    /// `marker` (the last name returned before). `.` and `..` come first, except at the
    /// root. A call without a marker starts a new enumeration, which lists the directory
    /// afresh; the pages after it come from that listing, with this volume's own changes since.
    /// Every entry is returned: WinFsp matches the caller's pattern itself.
    pub async fn read_directory(&self, h: &WinHandle, marker: Option<&str>) -> FsResult<DirPage> {
        if !h.is_dir() {
            return Err(FsError::NotDir);
        }
        let age = if marker.is_none() { Age::Now } else { Age::Any };
        let listing = self.listing(h.ino, age).await?;
        let mut entries = Vec::new();
        if h.ino != ROOT_INO && matches!(marker, None | Some(".")) {
            let me = self.fs.getattr(h.ino).await?;
            let info = self.info(&me, None);
            if marker.is_none() {
                entries.push(WinEntry {
                    name: ".".to_string(),
                    info,
                });
            }
            entries.push(WinEntry {
                name: "..".to_string(),
                info,
            });
        }
        let after = match marker {
            None | Some(".") | Some("..") => Bound::Unbounded,
            Some(m) => Bound::Excluded(fold(m)),
        };
        let mut rest = listing.entries.range((after, Bound::Unbounded));
        for (_, n) in rest.by_ref().take(DIR_PAGE.saturating_sub(entries.len())) {
            entries.push(WinEntry {
                name: n.win.clone(),
                info: self.info(&n.attr, None),
            });
        }
        let end = rest.next().is_none();
        Ok(DirPage { entries, end })
    }

    /// One entry of directory `h` by Windows name (WinFsp's get_dir_info_by_name).
    pub async fn dir_info_by_name(&self, h: &WinHandle, win_name: &str) -> FsResult<WinEntry> {
        if !h.is_dir() {
            return Err(FsError::NotDir);
        }
        let (attr, name) = self.child(h.ino, win_name).await?;
        self.fs.forget(attr.ino, 1);
        Ok(WinEntry {
            name,
            info: self.info(&attr, None),
        })
    }
}

mod listing;
#[cfg(test)]
mod tests;
