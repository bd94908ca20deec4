//! The one security descriptor every file and directory reports, and the control pipe's.
//! A bucket has no ACLs, so Windows sees a fixed descriptor, configurable with `--security`
//! (SDDL).
//!
//! By default only the user who mounted, SYSTEM and Administrators may use the drive (and its
//! control pipe): the mount holds the machine's bucket credentials, and a drive every local
//! user could read and write would share them with everyone. Under the WinFsp launcher the
//! mount runs as SYSTEM, so the launcher's users get in only through a `--security` that names
//! their group (see `docs/windows.md`).

use windows::core::HSTRING;
use windows::Win32::Foundation::{LocalFree, HLOCAL};
use windows::Win32::Security::Authorization::{
    ConvertStringSecurityDescriptorToSecurityDescriptorW, SDDL_REVISION_1,
};
use windows::Win32::Security::{GetSecurityDescriptorLength, PSECURITY_DESCRIPTOR};

/// The files' descriptor for the user whose SID is `me`: owner and group `me`; full access
/// for SYSTEM, Administrators and `me`, nobody else.
pub fn files_sddl(me: &str) -> String {
    format!("O:{me}G:{me}D:P(A;;FA;;;SY)(A;;FA;;;BA)(A;;FA;;;{me})")
}

/// The control pipe's: full access for SYSTEM, Administrators and `me` (who started the
/// mount); nobody else may even connect.
pub fn pipe_sddl(me: &str) -> String {
    format!("D:P(A;;GA;;;SY)(A;;GA;;;BA)(A;;GA;;;{me})")
}

/// The SID of the user this process runs as, in its string form (`S-1-5-21-…`, or `S-1-5-18`
/// for SYSTEM).
pub fn current_user_sid() -> Result<String, String> {
    fs_core::platform::current_user_sid()
        .map_err(|e| format!("cannot read this process's user: {e}"))
}

/// The largest descriptor that works. WinFsp first asks for a file's descriptor with a
/// 1,024-byte buffer, and asks again with a bigger one only if told the size it needs; winfsp-rs
/// reports that size only when the copy succeeds, so with a larger descriptor every open fails
/// and is retried forever. Refused at mount time instead.
pub const MAX_DESCRIPTOR_BYTES: usize = 1024;

/// A self-relative security descriptor, as bytes WinFsp copies out.
pub struct Descriptor(Vec<u8>);

impl Descriptor {
    /// The raw self-relative descriptor (for a `SECURITY_ATTRIBUTES`).
    pub fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }

    /// Parses SDDL; a bad string is a clear error at mount time.
    pub fn from_sddl(sddl: &str) -> Result<Self, String> {
        let mut psd = PSECURITY_DESCRIPTOR::default();
        let mut len = 0u32;
        // SAFETY: the out-pointers are valid; on success Windows allocates the descriptor with
        // LocalAlloc and we free it below after copying it.
        unsafe {
            ConvertStringSecurityDescriptorToSecurityDescriptorW(
                &HSTRING::from(sddl),
                SDDL_REVISION_1,
                &mut psd,
                Some(&mut len),
            )
        }
        .map_err(|e| format!("invalid --security {sddl:?}: {e}"))?;
        // SAFETY: `psd` is a valid descriptor of `len` bytes (checked against its own length).
        let bytes = unsafe {
            let real = GetSecurityDescriptorLength(psd) as usize;
            let bytes =
                std::slice::from_raw_parts(psd.0 as *const u8, real.min(len as usize)).to_vec();
            let _ = LocalFree(Some(HLOCAL(psd.0)));
            bytes
        };
        if bytes.len() > MAX_DESCRIPTOR_BYTES {
            return Err(format!(
                "--security {sddl:?} is {} bytes as a descriptor; WinFsp takes at most {MAX_DESCRIPTOR_BYTES}: use fewer entries",
                bytes.len()
            ));
        }
        Ok(Descriptor(bytes))
    }

    pub fn len(&self) -> u64 {
        self.0.len() as u64
    }

    /// Copies the descriptor into WinFsp's buffer; false if it does not fit.
    pub fn copy_to(&self, out: &mut [std::ffi::c_void]) -> bool {
        if out.len() < self.0.len() {
            return false;
        }
        // SAFETY: `out` has room for the descriptor's bytes; the regions cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.0.as_ptr(),
                out.as_mut_ptr().cast::<u8>(),
                self.0.len(),
            );
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use windows::core::PWSTR;
    use windows::Win32::Security::Authorization::ConvertSecurityDescriptorToStringSecurityDescriptorW;
    use windows::Win32::Security::{DACL_SECURITY_INFORMATION, OWNER_SECURITY_INFORMATION};

    /// Nothing in this crate enforces ACLs: Windows does, from the descriptors built here. So
    /// each is parsed back the way Windows reads it, and must grant nobody beyond the user,
    /// SYSTEM and Administrators (no Everyone, no Users, no Authenticated Users).
    #[test]
    fn the_default_descriptors_admit_only_the_user_system_and_administrators() {
        let me = current_user_sid().expect("this process has a user");
        for sddl in [files_sddl(&me), pipe_sddl(&me)] {
            let d = Descriptor::from_sddl(&sddl).expect("valid SDDL");
            let mut text = PWSTR::null();
            // SAFETY: `d` holds a valid self-relative descriptor; Windows allocates `text`.
            unsafe {
                ConvertSecurityDescriptorToStringSecurityDescriptorW(
                    PSECURITY_DESCRIPTOR(d.as_ptr() as *mut _),
                    SDDL_REVISION_1,
                    DACL_SECURITY_INFORMATION | OWNER_SECURITY_INFORMATION,
                    &mut text,
                    None,
                )
            }
            .expect("the descriptor converts back");
            // SAFETY: as above; freed after copying.
            let back = unsafe {
                let s = text.to_string().unwrap();
                let _ = LocalFree(Some(HLOCAL(text.0.cast())));
                s
            };
            for wide in [";;;WD)", ";;;BU)", ";;;AU)", ";;;IU)"] {
                assert!(!back.contains(wide), "{back} grants {wide}");
            }
            assert!(back.contains(";;;SY)") && back.contains(";;;BA)"), "{back}");
        }
    }
}
