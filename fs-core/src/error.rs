//! Filesystem errors, and the one place they become `errno` (Linux) and `NTSTATUS` (Windows).
//!
//! Every layer below the facade reports a [`StoreError`](crate::store::StoreError) or an
//! [`FsError`]; adapters never invent their own codes. Keeping both mappings side by side makes it
//! hard for Linux and Windows to drift apart on what, say, a precondition failure means.

use crate::store::{StoreError, StoreErrorKind};

/// An error the filesystem reports to the kernel.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    /// A directory on the way to the name is missing (Windows tells this apart).
    #[error("no such directory in the path")]
    PathNotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("read-only file system")]
    ReadOnly,
    #[error("the object changed in the bucket while it was open")]
    Stale,
    #[error("name cannot be stored in the bucket: {0}")]
    InvalidName(String),
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// An operation this mount does not allow anyone (`EPERM`): a chown to an owner outside
    /// the mount's set.
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    #[error("bad file handle")]
    BadHandle,
    #[error("checksum mismatch: {0}")]
    Corrupt(String),
    #[error("bucket busy, retries exhausted: {0}")]
    Busy(String),
    #[error("operation not supported")]
    Unsupported,
    #[error("no space left on the cache disk")]
    NoSpace,
    #[error("directory has too many objects to rename")]
    CrossDevice,
    #[error("not a symbolic link")]
    NotSymlink,
    /// The file is open in a way that admits no other kind of open now (its readers pass
    /// through to a read-cache file: no writer may join them), as Linux refuses to write an
    /// executable being run.
    #[error("file busy")]
    FileBusy,
    /// A Windows read at or past the end of a file.
    #[error("end of file")]
    EndOfFile,
    #[error("I/O error: {0}")]
    Io(String),
}

impl FsError {
    /// The Linux errno for this error, used by the FUSE adapter.
    #[cfg(unix)]
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound | FsError::PathNotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::ReadOnly => libc::EROFS,
            FsError::Stale => libc::ESTALE,
            FsError::InvalidName(_) => libc::EINVAL,
            FsError::PermissionDenied(_) => libc::EACCES,
            FsError::NotPermitted(_) => libc::EPERM,
            FsError::BadHandle => libc::EBADF,
            FsError::Corrupt(_) => libc::EIO,
            FsError::Busy(_) => libc::EAGAIN,
            FsError::Unsupported => libc::ENOSYS,
            FsError::NoSpace => libc::ENOSPC,
            FsError::CrossDevice => libc::EXDEV,
            FsError::NotSymlink => libc::EINVAL,
            FsError::FileBusy => libc::ETXTBSY,
            FsError::EndOfFile => libc::EIO,
            FsError::Io(_) => libc::EIO,
        }
    }

    /// The Windows `NTSTATUS` for this error, used by the WinFsp adapter.
    pub fn ntstatus(&self) -> u32 {
        match self {
            FsError::NotFound => 0xC000_0034, // STATUS_OBJECT_NAME_NOT_FOUND
            FsError::PathNotFound => 0xC000_003A, // STATUS_OBJECT_PATH_NOT_FOUND
            FsError::Exists => 0xC000_0035,   // STATUS_OBJECT_NAME_COLLISION
            FsError::NotDir => 0xC000_0103,   // STATUS_NOT_A_DIRECTORY
            FsError::IsDir => 0xC000_00BA,    // STATUS_FILE_IS_A_DIRECTORY
            FsError::NotEmpty => 0xC000_0101, // STATUS_DIRECTORY_NOT_EMPTY
            FsError::ReadOnly => 0xC000_00A2, // STATUS_MEDIA_WRITE_PROTECTED
            FsError::Stale => 0xC000_0128,    // STATUS_FILE_CLOSED
            FsError::InvalidName(_) => 0xC000_0033, // STATUS_OBJECT_NAME_INVALID
            FsError::PermissionDenied(_) | FsError::NotPermitted(_) => 0xC000_0022, // STATUS_ACCESS_DENIED
            FsError::BadHandle => 0xC000_0008, // STATUS_INVALID_HANDLE
            FsError::Corrupt(_) => 0xC000_003E, // STATUS_DATA_ERROR
            FsError::Busy(_) => 0xC000_00B5,   // STATUS_IO_TIMEOUT
            FsError::Unsupported => 0xC000_00BB, // STATUS_NOT_SUPPORTED
            FsError::NoSpace => 0xC000_007F,   // STATUS_DISK_FULL
            FsError::CrossDevice => 0xC000_00D4, // STATUS_NOT_SAME_DEVICE
            FsError::NotSymlink => 0xC000_0275, // STATUS_NOT_A_REPARSE_POINT
            FsError::FileBusy => 0xC000_0043,  // STATUS_SHARING_VIOLATION
            FsError::EndOfFile => 0xC000_0011, // STATUS_END_OF_FILE
            FsError::Io(_) => 0xC000_0185,     // STATUS_IO_DEVICE_ERROR
        }
    }
}

impl From<StoreError> for FsError {
    fn from(e: StoreError) -> Self {
        match e.kind {
            StoreErrorKind::NotFound => FsError::NotFound,
            StoreErrorKind::PreconditionFailed => FsError::Stale,
            StoreErrorKind::PermissionDenied => FsError::PermissionDenied(e.message),
            StoreErrorKind::Throttled | StoreErrorKind::Transient => FsError::Busy(e.message),
            StoreErrorKind::InvalidArgument | StoreErrorKind::Other => FsError::Io(e.message),
        }
    }
}

impl FsError {
    /// The error for a read pinned to a generation: `NotFound` there means the generation
    /// vanished (the object was replaced or deleted while open), which is `Stale`.
    pub fn from_pinned_read(e: StoreError) -> FsError {
        if e.kind == StoreErrorKind::NotFound {
            FsError::Stale
        } else {
            e.into()
        }
    }
}

impl From<std::io::Error> for FsError {
    fn from(e: std::io::Error) -> Self {
        if crate::platform::is_disk_full(&e) {
            FsError::NoSpace
        } else {
            FsError::Io(e.to_string())
        }
    }
}

pub type FsResult<T> = Result<T, FsError>;
