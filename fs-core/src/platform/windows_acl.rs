//! Windows: the access control list of the mount's own directories.
//!
//! Unix gives them mode 0700. The Windows equivalent is a *protected* DACL (not inheriting
//! from the parent) that grants full access to the user the mount runs as, SYSTEM and
//! Administrators, and nobody else, inherited by every file and directory made inside. A
//! directory in the user's profile already inherits about that; one under `--cache-dir
//! D:\cache` would otherwise inherit `D:\`'s, where every authenticated user may create
//! files and folders. Windows enforces the list; Wine stores it but checks nothing, so the
//! test reads the list back and `docs/windows.md`'s checklist has the check on Windows.

use std::io;
use std::os::windows::ffi::OsStrExt;

use windows_sys::Win32::Foundation::{CloseHandle, LocalFree, ERROR_SUCCESS, HANDLE};
use windows_sys::Win32::Security::Authorization::{
    ConvertSidToStringSidW, ConvertStringSecurityDescriptorToSecurityDescriptorW, SDDL_REVISION_1,
    SE_FILE_OBJECT,
};
use windows_sys::Win32::Security::{
    GetSecurityDescriptorDacl, GetTokenInformation, TokenUser, ACL, DACL_SECURITY_INFORMATION,
    PROTECTED_DACL_SECURITY_INFORMATION, PSECURITY_DESCRIPTOR, TOKEN_QUERY, TOKEN_USER,
};
use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcessToken};

fn wide(s: &std::ffi::OsStr) -> Vec<u16> {
    s.encode_wide().chain(std::iter::once(0)).collect()
}

/// A NUL-terminated UTF-16 string Windows allocated with `LocalAlloc`, copied and freed.
///
/// # Safety
/// `p` must be such a string.
unsafe fn take_local_wide(p: *mut u16) -> String {
    let mut n = 0;
    while *p.add(n) != 0 {
        n += 1;
    }
    let s = String::from_utf16_lossy(std::slice::from_raw_parts(p, n));
    LocalFree(p.cast());
    s
}

/// The SID of the user this process runs as, in its string form (`S-1-5-21-…`, or
/// `S-1-5-18` for SYSTEM).
pub fn current_user_sid() -> io::Result<String> {
    let mut token: HANDLE = std::ptr::null_mut();
    // SAFETY: the pseudo-handle of the current process needs no closing; `token` is written on
    // success and closed below.
    if unsafe { OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &mut token) } == 0 {
        return Err(io::Error::last_os_error());
    }
    let result = (|| {
        let mut len = 0u32;
        // SAFETY: a size query; it "fails" with ERROR_INSUFFICIENT_BUFFER, as expected.
        unsafe { GetTokenInformation(token, TokenUser, std::ptr::null_mut(), 0, &mut len) };
        let mut buf = vec![0u64; (len as usize).div_ceil(8).max(1)];
        // SAFETY: `buf` has room for `len` bytes and is 8-aligned, as TOKEN_USER needs.
        if unsafe { GetTokenInformation(token, TokenUser, buf.as_mut_ptr().cast(), len, &mut len) }
            == 0
        {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: on success the buffer starts with a TOKEN_USER whose SID points inside it.
        let sid = unsafe { (*buf.as_ptr().cast::<TOKEN_USER>()).User.Sid };
        let mut text: *mut u16 = std::ptr::null_mut();
        // SAFETY: `sid` is valid while `buf` lives; Windows allocates `text`.
        if unsafe { ConvertSidToStringSidW(sid, &mut text) } == 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `text` is the string Windows just allocated.
        Ok(unsafe { take_local_wide(text) })
    })();
    // SAFETY: `token` was opened above.
    unsafe { CloseHandle(token) };
    result
}

/// The SID of the owner of the file or directory open as `f`, in its string form.
pub fn owner_sid(f: &std::fs::File) -> io::Result<String> {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Security::Authorization::GetSecurityInfo;
    use windows_sys::Win32::Security::{OWNER_SECURITY_INFORMATION, PSID};
    let mut owner: PSID = std::ptr::null_mut();
    let mut sd: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
    // SAFETY: the handle is open with READ_CONTROL; Windows allocates `sd` (which `owner`
    // points into), freed below.
    let rc = unsafe {
        GetSecurityInfo(
            f.as_raw_handle(),
            SE_FILE_OBJECT,
            OWNER_SECURITY_INFORMATION,
            &mut owner,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut sd,
        )
    };
    if rc != ERROR_SUCCESS {
        return Err(io::Error::from_raw_os_error(rc as i32));
    }
    let mut text: *mut u16 = std::ptr::null_mut();
    // SAFETY: `owner` is valid while `sd` lives; Windows allocates `text`.
    let result = if unsafe { ConvertSidToStringSidW(owner, &mut text) } == 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: `text` is the string Windows just allocated.
        Ok(unsafe { take_local_wide(text) })
    };
    // SAFETY: allocated by Windows above.
    unsafe { LocalFree(sd) };
    result
}

/// The DACL of the mount's directories, for the user whose SID is `me`: protected, full
/// access for SYSTEM, Administrators and `me`, inherited by files (OI) and folders (CI).
pub fn private_dacl_sddl(me: &str) -> String {
    format!("D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)(A;OICI;FA;;;{me})")
}

/// Gives the directory held open by `dir` (with `WRITE_DAC`) the [`private_dacl_sddl`] of
/// the user this process runs as.
pub fn make_private(dir: &std::fs::File) -> io::Result<()> {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Security::Authorization::SetSecurityInfo;
    let me = current_user_sid()?;
    let sddl = wide(std::ffi::OsStr::new(&private_dacl_sddl(&me)));
    let mut sd: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
    // SAFETY: `sddl` is NUL-terminated; Windows allocates `sd`, freed below.
    if unsafe {
        ConvertStringSecurityDescriptorToSecurityDescriptorW(
            sddl.as_ptr(),
            SDDL_REVISION_1,
            &mut sd,
            std::ptr::null_mut(),
        )
    } == 0
    {
        return Err(io::Error::last_os_error());
    }
    let result = (|| {
        let (mut present, mut defaulted) = (0, 0);
        let mut dacl: *mut ACL = std::ptr::null_mut();
        // SAFETY: `sd` is a valid descriptor; `dacl` points into it.
        if unsafe { GetSecurityDescriptorDacl(sd, &mut present, &mut dacl, &mut defaulted) } == 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the handle is open with WRITE_DAC, and `dacl` valid while `sd` lives.
        let rc = unsafe {
            SetSecurityInfo(
                dir.as_raw_handle(),
                SE_FILE_OBJECT,
                DACL_SECURITY_INFORMATION | PROTECTED_DACL_SECURITY_INFORMATION,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                dacl,
                std::ptr::null(),
            )
        };
        if rc != ERROR_SUCCESS {
            return Err(io::Error::from_raw_os_error(rc as i32));
        }
        Ok(())
    })();
    // SAFETY: `sd` was allocated by Windows above.
    unsafe { LocalFree(sd) };
    result
}

/// `sddl` as Windows reads it: parsed into a descriptor and written back as SDDL (tests).
#[cfg(test)]
fn parsed_back(sddl: &str) -> io::Result<String> {
    use windows_sys::Win32::Security::Authorization::ConvertSecurityDescriptorToStringSecurityDescriptorW;
    let text = wide(std::ffi::OsStr::new(sddl));
    let mut sd: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
    // SAFETY: `text` is NUL-terminated; Windows allocates `sd`, freed below.
    if unsafe {
        ConvertStringSecurityDescriptorToSecurityDescriptorW(
            text.as_ptr(),
            SDDL_REVISION_1,
            &mut sd,
            std::ptr::null_mut(),
        )
    } == 0
    {
        return Err(io::Error::last_os_error());
    }
    let mut out: *mut u16 = std::ptr::null_mut();
    // SAFETY: `sd` is valid; Windows allocates `out`.
    let ok = unsafe {
        ConvertSecurityDescriptorToStringSecurityDescriptorW(
            sd,
            SDDL_REVISION_1,
            DACL_SECURITY_INFORMATION,
            &mut out,
            std::ptr::null_mut(),
        )
    };
    let result = if ok == 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: `out` is the string Windows just allocated.
        Ok(unsafe { take_local_wide(out) })
    };
    // SAFETY: allocated by Windows above.
    unsafe { LocalFree(sd) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Windows enforces the list, nothing here does: so the list is parsed back the way
    /// Windows reads it and must be protected (nothing inherited from a parent such as
    /// `D:\`) and grant nobody beyond the user, SYSTEM and Administrators. Wine accepts the
    /// list on our directories but shows them by their Unix mode bits, so reading it back
    /// from a directory is on docs/windows.md's checklist, for Windows.
    #[test]
    fn our_directories_admit_only_the_user_system_and_administrators() {
        let me = current_user_sid().unwrap();
        let back = parsed_back(&private_dacl_sddl(&me)).unwrap();
        assert!(back.starts_with("D:P"), "{back} is not protected");
        for wide in [";;;WD)", ";;;BU)", ";;;AU)", ";;;IU)"] {
            assert!(!back.contains(wide), "{back} grants {wide}");
        }
        assert!(back.contains(&format!(";;;{me})")), "{back} lacks {me}");
        assert!(back.contains(";;;SY)") && back.contains(";;;BA)"), "{back}");
        // And it is applied: a directory of ours and one below it take it.
        let base = tempfile::tempdir().unwrap();
        let dir = crate::platform::Dir::private(&base.path().join("cache")).unwrap();
        dir.child("staging").unwrap();
    }
}
