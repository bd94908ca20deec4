//! WinFsp's `FileSystemContext`, translated onto the core's Windows [`Volume`].
//!
//! Each callback converts WinFsp's UTF-16 strings and buffers, runs the core's future on the
//! mount's tokio runtime, and maps the core's error to its NTSTATUS through `FsError::ntstatus`.
//! No decision is made here.
//!
//! Read, write and read-directory are the calls WinFsp lets a file system leave pending: they
//! go through `AsyncFileSystemContext`, which spawns the future on the runtime and frees the
//! dispatcher thread at once, so a read waiting on the network never holds one of WinFsp's
//! threads. The other callbacks block their dispatcher thread on the future; the core keeps
//! them off the network where it can (open and create answer from kept listings, flush
//! stops at the local disk).

use std::ffi::c_void;
use std::future::Future;
use std::sync::Arc;

use fs_core::store::ObjectStore;
use fs_core::windows::volume::{OpenOptions, Opened, Volume, WinEntry, WinHandle, WinInfo};
use fs_core::FsError;
use windows::Win32::Globalization::{CompareStringOrdinal, CSTR_EQUAL};
use winfsp::constants::FSP_FSCTL_TRANSACT_RSP_BUFFER_SIZEMAX;
use winfsp::filesystem::{
    AsyncFileSystemContext, DirInfo, DirMarker, FileInfo, FileSecurity, FileSystemContext,
    OpenFileInfo, VolumeInfo, WideNameInfo,
};
use winfsp::{FspError, U16CStr};

use crate::security::Descriptor;

/// WinFsp's cleanup flag for a file marked for deletion.
const CLEANUP_DELETE: u32 = 0x01;
/// STATUS_BUFFER_OVERFLOW: the security descriptor does not fit the caller's buffer.
const STATUS_BUFFER_OVERFLOW: i32 = 0x8000_0005_u32 as i32;
/// STATUS_OBJECT_NAME_INVALID, for names that are not valid UTF-16.
const STATUS_OBJECT_NAME_INVALID: i32 = 0xC000_0033_u32 as i32;

fn status(e: FsError) -> FspError {
    if !matches!(
        e,
        FsError::NotFound | FsError::PathNotFound | FsError::EndOfFile
    ) {
        tracing::debug!(error = %e, "request failed");
    }
    FspError::NTSTATUS(e.ntstatus() as i32)
}

fn name(s: &U16CStr) -> winfsp::Result<String> {
    s.to_string()
        .map_err(|_| FspError::NTSTATUS(STATUS_OBJECT_NAME_INVALID))
}

/// Gives WinFsp the opened file's name as the directories show it. On a case-insensitive
/// volume WinFsp otherwise keeps the name as the caller spelled it, upper-cased: a case-only
/// rename would then look like no change, and change notifications would show capitals.
///
/// WinFsp refuses a name that differs from `requested` other than by case. The core folds
/// case as Windows does for every letter its own tables share with Windows'; the check here
/// uses Windows' own table (the one NTFS uses), so a letter they disagree on (a capital added
/// to Unicode after Windows' table) leaves WinFsp's default rather than failing the open.
fn fill_opened(out: &mut OpenFileInfo, opened: &Opened, requested: &U16CStr) {
    fill(out.as_mut(), &opened.info);
    let wide: Vec<u16> = opened.name.encode_utf16().collect();
    // SAFETY: both are plain UTF-16 slices; the call only reads them.
    let same = unsafe { CompareStringOrdinal(requested.as_slice(), &wide, true) } == CSTR_EQUAL;
    let bytes = (wide.len() + 1) * 2;
    if same
        && bytes <= usize::from(out.normalized_name_size())
        && bytes < FSP_FSCTL_TRANSACT_RSP_BUFFER_SIZEMAX
    {
        out.set_normalized_name(&wide, Some(u16::from(b'\\')));
    }
}

fn fill(out: &mut FileInfo, info: &WinInfo) {
    out.file_attributes = info.attributes;
    out.reparse_tag = 0;
    out.allocation_size = info.allocation_size;
    out.file_size = info.file_size;
    out.creation_time = info.creation_time;
    out.last_access_time = info.last_access_time;
    out.last_write_time = info.last_write_time;
    out.change_time = info.change_time;
    out.index_number = info.index_number;
    out.hard_links = 0;
    out.ea_size = 0;
}

/// One mounted bucket as WinFsp sees it.
pub struct BucketFs<S: ObjectStore> {
    volume: Arc<Volume<S>>,
    rt: tokio::runtime::Handle,
    security: Descriptor,
}

impl<S: ObjectStore> BucketFs<S> {
    pub fn new(volume: Arc<Volume<S>>, rt: tokio::runtime::Handle, security: Descriptor) -> Self {
        BucketFs {
            volume,
            rt,
            security,
        }
    }

    /// Runs a core call to completion on the mount's runtime.
    fn run<T>(&self, f: impl Future<Output = Result<T, FsError>>) -> winfsp::Result<T> {
        self.rt.block_on(f).map_err(status)
    }

    fn security_into(&self, out: Option<&mut [c_void]>) -> winfsp::Result<u64> {
        if let Some(buf) = out {
            if !self.security.copy_to(buf) {
                return Err(FspError::NTSTATUS(STATUS_BUFFER_OVERFLOW));
            }
        }
        Ok(self.security.len())
    }

    /// Fills `buffer` with the directory's entries after `marker`, page by page from the
    /// core, until the buffer is full (WinFsp then asks again after the last name it got) or
    /// the directory ends. The pattern is not used: WinFsp matches it with Windows' rules.
    async fn fill_directory(
        &self,
        context: &WinHandle,
        marker: Option<String>,
        buffer: &mut [u8],
    ) -> winfsp::Result<u32> {
        let mut cursor = 0u32;
        let mut marker = marker;
        loop {
            let page = self
                .volume
                .read_directory(context, marker.as_deref())
                .await
                .map_err(status)?;
            for entry in &page.entries {
                if !Self::write_entry(entry, buffer, &mut cursor) {
                    return Ok(cursor);
                }
            }
            match page.entries.last() {
                Some(last) if !page.end => marker = Some(last.name.clone()),
                _ => {
                    DirInfo::<255>::finalize_buffer(buffer, &mut cursor);
                    return Ok(cursor);
                }
            }
        }
    }

    fn write_entry(entry: &WinEntry, buffer: &mut [u8], cursor: &mut u32) -> bool {
        let mut di = DirInfo::<255>::new();
        fill(di.file_info_mut(), &entry.info);
        if di.set_name(&entry.name).is_err() {
            // Longer than a directory entry holds; the core already skips such names.
            return true;
        }
        di.append_to_buffer(buffer, cursor)
    }
}

impl<S: ObjectStore> FileSystemContext for BucketFs<S> {
    type FileContext = WinHandle;

    fn get_security_by_name(
        &self,
        file_name: &U16CStr,
        security_descriptor: Option<&mut [c_void]>,
        _reparse_point_resolver: impl FnOnce(&U16CStr) -> Option<FileSecurity>,
    ) -> winfsp::Result<FileSecurity> {
        let path = name(file_name)?;
        let attributes = self.run(self.volume.attributes_of(&path))?;
        Ok(FileSecurity {
            reparse: false,
            sz_security_descriptor: self.security_into(security_descriptor)?,
            attributes,
        })
    }

    fn open(
        &self,
        file_name: &U16CStr,
        create_options: u32,
        _granted_access: u32,
        file_info: &mut OpenFileInfo,
    ) -> winfsp::Result<Self::FileContext> {
        let path = name(file_name)?;
        let opts = OpenOptions::from_create_options(create_options);
        let opened = self.run(self.volume.open(&path, opts))?;
        fill_opened(file_info, &opened, file_name);
        Ok(opened.handle)
    }

    fn close(&self, context: Self::FileContext) {
        self.rt.block_on(self.volume.close(context));
    }

    fn create(
        &self,
        file_name: &U16CStr,
        create_options: u32,
        _granted_access: u32,
        _file_attributes: u32,
        _security_descriptor: Option<&[c_void]>,
        allocation_size: u64,
        _extra_buffer: Option<&[u8]>,
        _extra_buffer_is_reparse_point: bool,
        file_info: &mut OpenFileInfo,
    ) -> winfsp::Result<Self::FileContext> {
        let path = name(file_name)?;
        let opts = OpenOptions::from_create_options(create_options);
        let opened = self.run(self.volume.create(&path, opts, allocation_size))?;
        fill_opened(file_info, &opened, file_name);
        Ok(opened.handle)
    }

    fn cleanup(&self, context: &Self::FileContext, _file_name: Option<&U16CStr>, flags: u32) {
        let delete = flags & CLEANUP_DELETE != 0;
        if let Err(e) = self.rt.block_on(self.volume.cleanup(context, delete)) {
            // Cleanup cannot fail in Windows; what could not be saved stays staged and
            // journaled, and is retried.
            tracing::warn!(ino = context.ino(), delete, error = %e, "cleanup failed");
        }
    }

    fn flush(
        &self,
        context: Option<&Self::FileContext>,
        file_info: &mut FileInfo,
    ) -> winfsp::Result<()> {
        // A volume flush (no file) has nothing to add: every close is already durable.
        let Some(handle) = context else {
            return Ok(());
        };
        let info = self.run(self.volume.flush(handle))?;
        fill(file_info, &info);
        Ok(())
    }

    fn get_file_info(
        &self,
        context: &Self::FileContext,
        file_info: &mut FileInfo,
    ) -> winfsp::Result<()> {
        let info = self.run(self.volume.file_info(context))?;
        fill(file_info, &info);
        Ok(())
    }

    fn get_security(
        &self,
        _context: &Self::FileContext,
        security_descriptor: Option<&mut [c_void]>,
    ) -> winfsp::Result<u64> {
        self.security_into(security_descriptor)
    }

    fn overwrite(
        &self,
        context: &Self::FileContext,
        _file_attributes: u32,
        _replace_file_attributes: bool,
        allocation_size: u64,
        _extra_buffer: Option<&[u8]>,
        file_info: &mut FileInfo,
    ) -> winfsp::Result<()> {
        let info = self.run(self.volume.overwrite(context, allocation_size))?;
        fill(file_info, &info);
        Ok(())
    }

    fn rename(
        &self,
        context: &Self::FileContext,
        _file_name: &U16CStr,
        new_file_name: &U16CStr,
        replace_if_exists: bool,
    ) -> winfsp::Result<()> {
        let to = name(new_file_name)?;
        self.run(self.volume.rename(context, &to, replace_if_exists))
    }

    fn set_basic_info(
        &self,
        context: &Self::FileContext,
        _file_attributes: u32,
        _creation_time: u64,
        _last_access_time: u64,
        last_write_time: u64,
        _last_change_time: u64,
        file_info: &mut FileInfo,
    ) -> winfsp::Result<()> {
        let info = self.run(self.volume.set_basic_info(context, last_write_time))?;
        fill(file_info, &info);
        Ok(())
    }

    fn set_delete(
        &self,
        context: &Self::FileContext,
        _file_name: &U16CStr,
        delete_file: bool,
    ) -> winfsp::Result<()> {
        self.run(self.volume.set_delete(context, delete_file))
    }

    fn set_file_size(
        &self,
        context: &Self::FileContext,
        new_size: u64,
        set_allocation_size: bool,
        file_info: &mut FileInfo,
    ) -> winfsp::Result<()> {
        let info = self.run(
            self.volume
                .set_file_size(context, new_size, set_allocation_size),
        )?;
        fill(file_info, &info);
        Ok(())
    }

    fn get_dir_info_by_name(
        &self,
        context: &Self::FileContext,
        file_name: &U16CStr,
        out_dir_info: &mut DirInfo,
    ) -> winfsp::Result<()> {
        let win_name = name(file_name)?;
        let entry = self.run(self.volume.dir_info_by_name(context, &win_name))?;
        fill(out_dir_info.file_info_mut(), &entry.info);
        out_dir_info.set_name(&entry.name)
    }

    fn get_volume_info(&self, out_volume_info: &mut VolumeInfo) -> winfsp::Result<()> {
        let st = self.volume.volume_stats();
        out_volume_info.total_size = st.total_size;
        out_volume_info.free_size = st.free_size;
        out_volume_info.set_volume_label(&st.label);
        Ok(())
    }
}

impl<S: ObjectStore> AsyncFileSystemContext for BucketFs<S> {
    async fn read_async(
        &self,
        context: &Self::FileContext,
        buffer: &mut [u8],
        offset: u64,
    ) -> winfsp::Result<u32> {
        let len = u32::try_from(buffer.len()).unwrap_or(u32::MAX);
        let data = self
            .volume
            .read(context, offset, len)
            .await
            .map_err(status)?;
        let n = data.len().min(buffer.len());
        buffer[..n].copy_from_slice(&data[..n]);
        Ok(n as u32)
    }

    async fn write_async(
        &self,
        context: &Self::FileContext,
        buffer: &[u8],
        offset: u64,
        write_to_eof: bool,
        constrained_io: bool,
        file_info: &mut FileInfo,
    ) -> winfsp::Result<u32> {
        let (n, info) = self
            .volume
            .write(context, offset, buffer, write_to_eof, constrained_io)
            .await
            .map_err(status)?;
        fill(file_info, &info);
        Ok(n)
    }

    fn read_directory_async(
        &self,
        context: &Self::FileContext,
        _pattern: Option<&U16CStr>,
        marker: DirMarker<'_>,
        buffer: &mut [u8],
    ) -> impl Future<Output = winfsp::Result<u32>> + Send {
        let marker = marker.inner_as_cstr().map(name).transpose();
        async move { self.fill_directory(context, marker?, buffer).await }
    }

    fn spawn_task(&self, future: impl Future<Output = ()> + Send + 'static) {
        self.rt.spawn(future);
    }
}
