//! Loading WinFsp. Its DLL is delay-loaded, so it must be loaded before the first call: from
//! the installed WinFsp (its directory is in the registry), or from next to the executable.

use windows::core::{w, HSTRING, PCWSTR};
use windows::Win32::System::LibraryLoader::LoadLibraryW;
use windows::Win32::System::Registry::{RegGetValueW, HKEY_LOCAL_MACHINE, RRF_RT_REG_SZ};

/// Where the WinFsp installer records its directory.
fn install_dir(subkey: PCWSTR) -> Option<String> {
    let mut buf = [0u16; 1024];
    let mut size = std::mem::size_of_val(&buf) as u32;
    // SAFETY: the buffer and size describe valid memory that RegGetValueW fills.
    let status = unsafe {
        RegGetValueW(
            HKEY_LOCAL_MACHINE,
            subkey,
            w!("InstallDir"),
            RRF_RT_REG_SZ,
            None,
            Some(buf.as_mut_ptr().cast()),
            Some(&mut size),
        )
    };
    if status.is_err() {
        return None;
    }
    let units = (size as usize / 2).min(buf.len());
    let s = String::from_utf16_lossy(&buf[..units]);
    Some(s.trim_end_matches('\0').to_string())
}

/// Loads WinFsp; the error tells the user to install it.
pub fn init() -> Result<winfsp::FspInit, String> {
    let installed = install_dir(w!("SOFTWARE\\WOW6432Node\\WinFsp"))
        .or_else(|| install_dir(w!("SOFTWARE\\WinFsp")));
    if let Some(dir) = installed {
        let dll = format!("{}\\bin\\winfsp-x64.dll", dir.trim_end_matches('\\'));
        // SAFETY: loading a library by full path; WinFsp's DllMain has no preconditions.
        // Once loaded, WinFsp's own lookup by bare name finds this module.
        if let Err(e) = unsafe { LoadLibraryW(&HSTRING::from(dll.as_str())) } {
            tracing::warn!("cannot load {dll}: {e}");
        }
    }
    winfsp::winfsp_init().map_err(|_| {
        "WinFsp is not installed: install it from https://winfsp.dev/rel/ and mount again"
            .to_string()
    })
}
