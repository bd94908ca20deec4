//! The one security descriptor every file and directory reports. A bucket has no ACLs, so
//! Windows sees a fixed descriptor, configurable with `--security` (SDDL).

use windows::core::HSTRING;
use windows::Win32::Foundation::{LocalFree, HLOCAL};
use windows::Win32::Security::Authorization::{
    ConvertStringSecurityDescriptorToSecurityDescriptorW, SDDL_REVISION_1,
};
use windows::Win32::Security::{GetSecurityDescriptorLength, PSECURITY_DESCRIPTOR};

/// Owner and group Administrators; full access for SYSTEM, Administrators and Everyone.
pub const DEFAULT_SDDL: &str = "O:BAG:BAD:P(A;;FA;;;SY)(A;;FA;;;BA)(A;;FA;;;WD)";

/// The largest descriptor that works. WinFsp first asks for a file's descriptor with a
/// 1,024-byte buffer, and asks again with a bigger one only if told the size it needs; winfsp-rs
/// reports that size only when the copy succeeds, so with a larger descriptor every open fails
/// and is retried forever. Refused at mount time instead.
pub const MAX_DESCRIPTOR_BYTES: usize = 1024;

/// A self-relative security descriptor, as bytes WinFsp copies out.
pub struct Descriptor(Vec<u8>);

impl Descriptor {
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
