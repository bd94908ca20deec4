//! `bucketdrive.exe`: the command-line entry point; everything else is in the library.

#[cfg(not(windows))]
compile_error!(
    "bucketdrive.exe is built for Windows only: \
     cargo build --release -p fs-windows --features exe --target x86_64-pc-windows-msvc"
);

#[cfg(windows)]
fn main() -> std::process::ExitCode {
    fs_windows::main()
}

#[cfg(not(windows))]
fn main() {}
