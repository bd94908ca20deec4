//! Links WinFsp's DLL with delay-loading, which WinFsp requires, but only on a real Windows
//! build: a `cross-check` build on another host only type-checks and never links, and the
//! `winfsp` build-dependency exists only on a Windows host.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(all(windows, feature = "winfsp"))]
    {
        let windows_target = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("windows");
        let cross_check = std::env::var_os("CARGO_FEATURE_CROSS_CHECK").is_some();
        if windows_target && !cross_check {
            winfsp::build::winfsp_link_delayload();
        }
    }
}
