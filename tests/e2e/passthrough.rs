//! End-to-end writes the kernel makes itself (FUSE passthrough, `--passthrough writes`, root
//! mounts): a new or rewritten file is read and written straight in its staged copy, while the
//! daemon's write and read counters do not move; what reaches the bucket is what was written.

use bucketdrive_tests::{
    map_shared, metric, random_bytes, sha256, wait_for_log, wait_for_object, Emulator, Mount,
    Result,
};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

const MIB: usize = 1024 * 1024;
const WRITTEN: &str = "bucketdrive_written_bytes_total";
const READ: &str = "bucketdrive_read_bytes_total";
const OPENS: &str = "bucketdrive_passthrough_opens_total";

fn setup(bucket: &str) -> Result<Emulator> {
    let emu = Emulator::start()?;
    emu.create_bucket(bucket)?;
    Ok(emu)
}

/// A mount with `--passthrough writes` and a metrics address, plus `extra`.
fn mount(emu: &Emulator, bucket: &str, extra: &[&str]) -> Result<(Mount, String)> {
    let addr = format!("127.0.0.1:{}", bucketdrive_tests::free_port()?);
    let mut args = vec!["--passthrough", "writes", "--metrics-addr", &addr];
    args.extend_from_slice(extra);
    let m = Mount::new(emu, bucket, &args)?;
    Ok((m, addr))
}

/// Waits (up to 30 s) until the mount at metrics address `addr` holds no staged bytes.
fn staged_copy_let_go(addr: &str) -> Result<()> {
    let t = std::time::Instant::now();
    while metric(addr, "bucketdrive_staged_bytes")? > 0.0 {
        anyhow::ensure!(
            t.elapsed().as_secs() < 30,
            "the staged copy is never let go after the mapping is gone"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    Ok(())
}

/// Writes, appends through a second handle, a truncate, a store through a shared mapping, and
/// a reader beside the writer: all in the staged copy by the kernel, the daemon's counters
/// still; `stat` shows the size as it grows; the bucket gets exactly the bytes written.
#[test]
fn a_new_file_is_written_and_read_by_the_kernel_itself() -> Result<()> {
    let emu = setup("ptw")?;
    let (m, addr) = mount(&emu, "ptw", &["--write-back-delay", "0s"])?;
    wait_for_log(&m, "reads and writes files being written")?;
    let path = m.path().join("f.bin");
    let mut want = random_bytes(6 * MIB + 123, 1);
    let mut w = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    assert_eq!(metric(&addr, OPENS)?, 1.0, "the create passed through");
    for chunk in want.chunks(MIB / 4) {
        w.write_all(chunk)?;
    }
    assert_eq!(std::fs::metadata(&path)?.len(), want.len() as u64, "stat");
    // A second handle joins (the kernel gives both one backing file) and appends.
    let mut a = std::fs::OpenOptions::new().append(true).open(&path)?;
    let tail = random_bytes(MIB + 7, 2);
    a.write_all(&tail)?;
    want.extend_from_slice(&tail);
    // A reader beside them reads what they wrote.
    let mut r = std::fs::File::open(&path)?;
    let mut got = Vec::new();
    r.read_to_end(&mut got)?;
    assert_eq!(sha256(&got), sha256(&want), "a reader beside the writers");
    assert_eq!(metric(&addr, OPENS)?, 3.0);
    // ftruncate: the daemon cuts the same file.
    w.set_len(5 * MIB as u64)?;
    want.truncate(5 * MIB);
    assert_eq!(std::fs::metadata(&path)?.len(), want.len() as u64);
    // A store through a shared mapping.
    let len = want.len();
    let map = map_shared(&w, len)?;
    // SAFETY: the mapping made above, `len` bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(map as *mut u8, len) };
    let patch = random_bytes(9_000, 3);
    bytes[MIB..MIB + patch.len()].copy_from_slice(&patch);
    want[MIB..MIB + patch.len()].copy_from_slice(&patch);
    // SAFETY: as above; no longer used.
    unsafe {
        libc::msync(map, len, libc::MS_SYNC);
        libc::munmap(map, len);
    }
    w.write_all_at(b"end", len as u64 - 3)?;
    want[len - 3..].copy_from_slice(b"end");
    drop((w, a, r));
    wait_for_object(&emu, "ptw", "f.bin", &sha256(&want), 60)?;
    assert_eq!(metric(&addr, WRITTEN)?, 0.0, "the daemon wrote nothing");
    assert_eq!(metric(&addr, READ)?, 0.0, "the daemon read nothing");
    m.unmount()
}

/// The default (`--passthrough auto`) on a writable root mount: a file written whole (a new
/// file, a copy over an existing one) is written by the kernel itself, and reaches the bucket
/// exactly; an edit of an object whose bytes are not local goes through the daemon (and
/// reaches the bucket exactly too).
#[test]
fn the_default_mount_has_the_kernel_write_files_written_whole() -> Result<()> {
    let emu = setup("ptauto")?;
    let old = random_bytes(2 * MIB + 5, 40);
    emu.put("ptauto", "old.bin", &old)?;
    let addr = format!("127.0.0.1:{}", bucketdrive_tests::free_port()?);
    let m = Mount::new(
        &emu,
        "ptauto",
        &["--passthrough", "auto", "--metrics-addr", &addr],
    )?;
    wait_for_log(
        &m,
        "FUSE passthrough: on (the kernel itself reads and writes files being written whose bytes are all local)",
    )?;
    let new = random_bytes(5 * MIB + 3, 41);
    std::fs::write(m.path().join("new.bin"), &new)?;
    let over = random_bytes(3 * MIB + 1, 42);
    std::fs::write(m.path().join("old.bin"), &over)?;
    assert_eq!(metric(&addr, OPENS)?, 2.0, "both opens passed through");
    assert_eq!(metric(&addr, WRITTEN)?, 0.0, "the daemon wrote nothing");
    let edited = random_bytes(MIB, 43);
    emu.put("ptauto", "edit.bin", &edited)?;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.path().join("edit.bin"))?;
    f.write_all_at(b"patch", 4096)?;
    drop(f);
    let mut want = edited.clone();
    want[4096..4101].copy_from_slice(b"patch");
    assert_eq!(
        metric(&addr, OPENS)?,
        2.0,
        "the edit's open did not pass through"
    );
    assert_eq!(
        metric(&addr, WRITTEN)?,
        5.0,
        "the edit went through the daemon"
    );
    m.unmount()?;
    for (name, bytes) in [("new.bin", &new), ("old.bin", &over), ("edit.bin", &want)] {
        assert_eq!(
            sha256(&emu.get("ptauto", name)?),
            sha256(bytes),
            "{name} in the bucket"
        );
    }
    Ok(())
}

/// A shared mapping that outlives its descriptor and the upload: a store through it after
/// the file is in the bucket is uploaded as a new version (the daemon finds the mapping in
/// the opener's /proc/<pid>/maps), and once it is unmapped the file settles.
#[test]
fn a_store_through_a_mapping_after_the_upload_reaches_the_bucket() -> Result<()> {
    let emu = setup("ptm")?;
    let (m, addr) = mount(&emu, "ptm", &["--write-back-delay", "0s"])?;
    let path = m.path().join("m.bin");
    let mut want = random_bytes(MIB + 5, 40);
    let len = want.len();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    f.write_all_at(&want, 0)?;
    let map = map_shared(&f, len)?;
    drop(f);
    wait_for_object(&emu, "ptm", "m.bin", &sha256(&want), 60)?;
    // SAFETY: the mapping made above, `len` bytes, still mapped.
    let bytes = unsafe { std::slice::from_raw_parts_mut(map as *mut u8, len) };
    let patch = random_bytes(5_000, 41);
    bytes[1000..1000 + patch.len()].copy_from_slice(&patch);
    want[1000..1000 + patch.len()].copy_from_slice(&patch);
    let uploaded = wait_for_object(&emu, "ptm", "m.bin", &sha256(&want), 60);
    // SAFETY: as above; no longer used.
    unsafe {
        libc::munmap(map, len);
    }
    uploaded?;
    assert_eq!(metric(&addr, WRITTEN)?, 0.0, "the daemon wrote nothing");
    m.unmount()?;
    assert_eq!(sha256(&emu.get("ptm", "m.bin")?), sha256(&want));
    Ok(())
}

/// A rewrite of an existing object (`O_TRUNC`) passes through too; fsync returns with it in
/// the bucket, and a write after the fsync is uploaded at close.
#[test]
fn a_rewrite_passes_through_and_fsync_keeps_its_meaning() -> Result<()> {
    let emu = setup("ptr")?;
    emu.put("ptr", "old.bin", &random_bytes(3 * MIB, 4))?;
    let (m, addr) = mount(&emu, "ptr", &["--write-back-delay", "1h"])?;
    let path = m.path().join("old.bin");
    let first = random_bytes(2 * MIB + 5, 5);
    let mut f = std::fs::File::create(&path)?;
    f.write_all(&first)?;
    f.sync_all()?;
    assert_eq!(sha256(&emu.get("ptr", "old.bin")?), sha256(&first), "fsync");
    let more = random_bytes(MIB, 6);
    f.write_all(&more)?;
    drop(f);
    let mut want = first;
    want.extend_from_slice(&more);
    assert_eq!(metric(&addr, WRITTEN)?, 0.0);
    assert!(metric(&addr, OPENS)? >= 1.0);
    // The unmount uploads what waits.
    m.unmount()?;
    assert_eq!(sha256(&emu.get("ptr", "old.bin")?), sha256(&want));
    Ok(())
}

/// A kill after passthrough writes and their close, before any upload: the next mount uploads
/// the last closed bytes, exactly.
#[test]
fn a_crash_after_passthrough_writes_loses_nothing_closed() -> Result<()> {
    let emu = setup("ptc")?;
    let cache = tempfile::tempdir()?;
    let args = ["--passthrough", "writes", "--write-back-delay", "1h"];
    let m = Mount::with_cache(&emu, "ptc", cache.path(), &args)?;
    let mut want = Vec::new();
    for i in 0..5 {
        let data = random_bytes(100_000 + i * 700_001, 10 + i as u64);
        std::fs::write(m.path().join(format!("c{i}")), &data)?;
        want.push((format!("c{i}"), sha256(&data)));
    }
    // One rewritten twice: the second close is the one that counts.
    let last = random_bytes(333_333, 20);
    std::fs::write(m.path().join("c0"), random_bytes(444_444, 21))?;
    std::fs::write(m.path().join("c0"), &last)?;
    want[0].1 = sha256(&last);
    assert!(emu.keys("ptc")?.is_empty(), "nothing uploaded yet");
    m.crash()?;
    let m = Mount::with_cache(&emu, "ptc", cache.path(), &["--write-back-delay", "0s"])?;
    for (name, sha) in &want {
        wait_for_object(&emu, "ptc", name, sha, 60)?;
    }
    m.unmount()
}

/// A close while another descriptor of the file stays open (a child holding a copy, say):
/// the file is uploaded as it is once due, without waiting for the last descriptor to go.
#[test]
fn a_close_beside_a_descriptor_left_open_uploads_once_due() -> Result<()> {
    let emu = setup("ptd")?;
    let (m, addr) = mount(&emu, "ptd", &["--write-back-delay", "0s"])?;
    let data = random_bytes(3 * MIB + 3, 50);
    let mut f = std::fs::File::create(m.path().join("d"))?;
    f.write_all(&data)?;
    let still_open = f.try_clone()?;
    bucketdrive_tests::close_checked(f)?;
    wait_for_object(&emu, "ptd", "d", &sha256(&data), 30)?;
    assert_eq!(metric(&addr, WRITTEN)?, 0.0, "written by the kernel itself");
    drop(still_open);
    m.unmount()
}

/// A kill after an fsync uploaded a file whose descriptor stays open, and more was written
/// through it: the next mount uploads the file with what was written after the upload.
#[test]
fn a_kill_after_an_fsync_keeps_what_was_written_since() -> Result<()> {
    let emu = setup("ptk")?;
    let cache = tempfile::tempdir()?;
    let args = ["--passthrough", "writes", "--write-back-delay", "1h"];
    let m = Mount::with_cache(&emu, "ptk", cache.path(), &args)?;
    let first = random_bytes(700_001, 40);
    let more = random_bytes(300_007, 41);
    let mut f = std::fs::File::create(m.path().join("k"))?;
    f.write_all(&first)?;
    f.sync_all()?;
    assert_eq!(sha256(&emu.get("ptk", "k")?), sha256(&first), "fsync");
    f.write_all(&more)?;
    m.crash()?;
    // The writer's descriptor goes after the daemon (its close meets no daemon).
    drop(f);
    let mut want = first;
    want.extend_from_slice(&more);
    let m = Mount::with_cache(&emu, "ptk", cache.path(), &["--write-back-delay", "0s"])?;
    wait_for_object(&emu, "ptk", "k", &sha256(&want), 60)?;
    m.unmount()
}

/// `--passthrough off`, `--passthrough on` (reads only) and a mount with `--cache-size` write
/// through the daemon as before.
#[test]
fn without_passthrough_writes_go_through_the_daemon() -> Result<()> {
    let emu = setup("ptoff")?;
    let data = random_bytes(3 * MIB + 1, 30);
    let modes = [
        &["--passthrough", "off"][..],
        &["--passthrough", "on"][..],
        &["--cache-size", "1GiB", "--passthrough", "writes"][..],
        // The default asks for nothing where it would pass nothing through: the mount keeps
        // the kernel's write-back cache.
        &["--cache-size", "1GiB", "--passthrough", "auto"][..],
    ];
    for (i, extra) in modes.iter().enumerate() {
        let addr = format!("127.0.0.1:{}", bucketdrive_tests::free_port()?);
        let mut args = vec!["--metrics-addr", &addr, "--write-back-delay", "0s"];
        args.extend_from_slice(extra);
        let m = Mount::new(&emu, "ptoff", &args)?;
        if i == 3 {
            wait_for_log(&m, "FUSE passthrough: off (--cache-size")?;
        }
        let name = format!("f{i}");
        std::fs::write(m.path().join(&name), &data)?;
        wait_for_object(&emu, "ptoff", &name, &sha256(&data), 60)?;
        assert_eq!(metric(&addr, OPENS)?, 0.0);
        assert_eq!(metric(&addr, WRITTEN)?, data.len() as f64);
        m.unmount()?;
    }
    Ok(())
}

/// A child that holds a shared mapping its parent made and handed down by `fork`, waiting on
/// a pipe for each step; killed and reaped when dropped.
struct MappingChild {
    pid: libc::pid_t,
    go: std::fs::File,
    done: std::fs::File,
}

impl MappingChild {
    /// Forks a child that, told to go once, copies `patch` to `at` (inside the mapping),
    /// says it is done, and exits when told to go again.
    fn fork(at: *mut u8, patch: &[u8]) -> Result<Self> {
        let (go_r, go_w) = pipe()?;
        let (done_r, done_w) = pipe()?;
        // SAFETY: the child runs only async-signal-safe calls (read, write, _exit) and copies
        // into memory prepared before the fork.
        let pid = unsafe { libc::fork() };
        anyhow::ensure!(pid >= 0, "fork failed");
        if pid == 0 {
            let mut b = [0u8; 1];
            // SAFETY: the child's own descriptors and the mapping it inherited. It keeps only
            // its two pipes (as stdin and stdout): no descriptor of the test process's, of
            // this mount or another test's, is held open by it.
            unsafe {
                libc::dup2(go_r.as_raw_fd(), 0);
                libc::dup2(done_w.as_raw_fd(), 1);
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                libc::read(0, b.as_mut_ptr().cast(), 1);
                std::ptr::copy_nonoverlapping(patch.as_ptr(), at, patch.len());
                libc::write(1, b.as_ptr().cast(), 1);
                libc::read(0, b.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        Ok(MappingChild {
            pid,
            go: go_w,
            done: done_r,
        })
    }

    /// Tells the child to take its next step; the first waits until its store is made.
    fn go(&mut self, wait: bool) -> Result<()> {
        self.go.write_all(b"g")?;
        if wait {
            let mut b = [0u8; 1];
            self.done.read_exact(&mut b)?;
        }
        Ok(())
    }
}

impl Drop for MappingChild {
    fn drop(&mut self) {
        // SAFETY: our own child, killed if still there and reaped.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

fn pipe() -> Result<(std::fs::File, std::fs::File)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors, which the Files then own.
    anyhow::ensure!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0);
    // SAFETY: fresh descriptors owned by nobody else.
    Ok(unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    })
}

/// A shared mapping handed to a child, the parent then gone from the file (unmapped and
/// closed): the daemon cannot find the child by the process that opened the file, yet the
/// kernel still has the file open for it. A store by the child after the upload is uploaded
/// as a new version, and once the child exits the staged copy is let go.
#[test]
fn a_mapping_handed_to_a_child_is_followed_after_the_opener_lets_go() -> Result<()> {
    let emu = setup("ptk")?;
    let (m, addr) = mount(&emu, "ptk", &["--write-back-delay", "0s"])?;
    wait_for_log(&m, "reads and writes files being written")?;
    let path = m.path().join("k.bin");
    let mut want = random_bytes(MIB + 5, 50);
    let len = want.len();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    f.write_all_at(&want, 0)?;
    let map = map_shared(&f, len)?;
    let patch = random_bytes(5_000, 51);
    // SAFETY: 1000 + 5000 bytes lie within the mapping.
    let mut child = MappingChild::fork(unsafe { map.cast::<u8>().add(1000) }, &patch)?;
    // SAFETY: our own mapping; the child keeps its copy of it.
    unsafe {
        libc::munmap(map, len);
    }
    drop(f);
    wait_for_object(&emu, "ptk", "k.bin", &sha256(&want), 60)?;
    // The moment the staged copy would have been let go, had the mapping not been seen.
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(
        metric(&addr, "bucketdrive_staged_bytes")? > 0.0,
        "the staged copy stays"
    );
    child.go(true)?;
    want[1000..1000 + patch.len()].copy_from_slice(&patch);
    wait_for_object(&emu, "ptk", "k.bin", &sha256(&want), 60)?;
    child.go(false)?;
    drop(child);
    staged_copy_let_go(&addr)?;
    assert_eq!(metric(&addr, WRITTEN)?, 0.0, "the daemon wrote nothing");
    m.unmount()?;
    assert_eq!(sha256(&emu.get("ptk", "k.bin")?), sha256(&want));
    Ok(())
}

/// A shared mapping that outlives a kill of the daemon: the process that made it goes on and
/// stores through it after the next mount has replayed and uploaded the file; that store is
/// uploaded too, and once it is unmapped the staged copy is let go.
#[test]
fn a_mapping_that_outlives_a_kill_is_followed_by_the_next_mount() -> Result<()> {
    let emu = setup("ptx")?;
    let cache = tempfile::tempdir()?;
    let args = ["--passthrough", "writes", "--write-back-delay", "1h"];
    let m = Mount::with_cache(&emu, "ptx", cache.path(), &args)?;
    wait_for_log(&m, "reads and writes files being written")?;
    let mut want = random_bytes(MIB + 9, 60);
    let len = want.len();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path().join("x.bin"))?;
    f.write_all_at(&want, 0)?;
    let map = map_shared(&f, len)?;
    struct Unmap(*mut libc::c_void, usize);
    impl Drop for Unmap {
        fn drop(&mut self) {
            // SAFETY: the mapping made above, unused once this runs.
            unsafe {
                libc::munmap(self.0, self.1);
            }
        }
    }
    let mapping = Unmap(map, len);
    drop(f);
    m.crash()?;
    let addr = format!("127.0.0.1:{}", bucketdrive_tests::free_port()?);
    let args = [
        "--passthrough",
        "writes",
        "--write-back-delay",
        "0s",
        "--metrics-addr",
        &addr,
    ];
    let m = Mount::with_cache(&emu, "ptx", cache.path(), &args)?;
    wait_for_object(&emu, "ptx", "x.bin", &sha256(&want), 60)?;
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(
        metric(&addr, "bucketdrive_staged_bytes")? > 0.0,
        "the staged copy stays while mapped"
    );
    // SAFETY: within the mapping, still mapped.
    let bytes = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), len) };
    let patch = random_bytes(4_000, 61);
    bytes[2000..2000 + patch.len()].copy_from_slice(&patch);
    want[2000..2000 + patch.len()].copy_from_slice(&patch);
    wait_for_object(&emu, "ptx", "x.bin", &sha256(&want), 60)?;
    drop(mapping);
    staged_copy_let_go(&addr)?;
    m.unmount()?;
    assert_eq!(sha256(&emu.get("ptx", "x.bin")?), sha256(&want));
    Ok(())
}

/// A cache disk that stops writing on command: ext4 (no journal, `errors=continue`, its own
/// blocks all written at mkfs) on a loop device over a sparse image in a smaller tmpfs. Filling the tmpfs makes every write of a block
/// not yet allocated in the image fail below ext4, as a thin device that ran out does: the
/// kernel writes the pages back and gets an error, and only an `fsync` is told. Emptying it
/// heals the disk. Torn down (unmounted, detached) when dropped.
struct FailingDisk {
    root: tempfile::TempDir,
    device: String,
}

impl FailingDisk {
    fn new() -> Result<Self> {
        let root = tempfile::tempdir()?;
        let (tmp, mnt) = (root.path().join("tmp"), root.path().join("mnt"));
        std::fs::create_dir_all(&tmp)?;
        std::fs::create_dir_all(&mnt)?;
        run(
            "mount",
            &["-t", "tmpfs", "-o", "size=192m", "tmpfs", path(&tmp)?],
        )?;
        let mut disk = FailingDisk {
            root,
            device: String::new(),
        };
        let image = tmp.join("image");
        // Over 1 GiB as ext4 sees it, so that files pass through (`PASSTHROUGH_ROOM`).
        std::fs::File::create(&image)?.set_len(2 << 30)?;
        disk.device = run("losetup", &["-f", "--show", path(&image)?])?
            .trim()
            .to_string();
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                // No journal, and every bitmap and inode table written now (no
                // uninitialised groups): what fails later is the data of files alone, not
                // the file system's own blocks.
                "-O",
                "^has_journal,^metadata_csum,^uninit_bg",
                "-E",
                "lazy_itable_init=0",
                &disk.device,
            ],
        )?;
        run(
            "mount",
            &["-o", "errors=continue", &disk.device, path(&mnt)?],
        )?;
        Ok(disk)
    }

    fn cache(&self) -> std::path::PathBuf {
        self.root.path().join("mnt").join("cache")
    }

    /// Fills the tmpfs under the image: writes of new blocks fail from now on.
    fn fail(&self) -> Result<()> {
        let filler = self.root.path().join("tmp").join("filler");
        let mut f = std::fs::File::create(filler)?;
        let chunk = vec![1u8; MIB];
        while f.write_all(&chunk).is_ok() {}
        Ok(())
    }

    fn heal(&self) -> Result<()> {
        std::fs::remove_file(self.root.path().join("tmp").join("filler"))?;
        Ok(())
    }
}

impl Drop for FailingDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.root.path().join("mnt"))
            .status();
        if !self.device.is_empty() {
            let _ = std::process::Command::new("losetup")
                .args(["-d", &self.device])
                .status();
        }
        let _ = std::process::Command::new("umount")
            .arg(self.root.path().join("tmp"))
            .status();
    }
}

fn path(p: &std::path::Path) -> Result<&str> {
    p.to_str().ok_or_else(|| anyhow::anyhow!("path not UTF-8"))
}

/// Runs `cmd` with `args`; its standard output.
fn run(cmd: &str, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(cmd).args(args).output()?;
    anyhow::ensure!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The cache disk fails to write back files the kernel wrote through passthrough (the
/// writers' writes and closes succeeded: only an fsync of the staged copy is told). A file
/// whose bytes the page cache still holds reaches the bucket exactly (its upload checks them
/// against the CRC32C it was sealed with); one whose pages were dropped meanwhile (a read then
/// shows what the disk holds) is not uploaded, and the bucket keeps its last whole version. Once
/// the disk works again, the file written over whole reaches the bucket exactly.
#[test]
fn a_write_back_the_cache_disk_failed_is_uploaded_only_as_written() -> Result<()> {
    let disk = FailingDisk::new()?;
    let emu = setup("pte")?;
    let good = random_bytes(100_000, 50);
    emu.put("pte", "f.bin", &good)?;
    let addr = format!("127.0.0.1:{}", bucketdrive_tests::free_port()?);
    let m = Mount::with_cache(
        &emu,
        "pte",
        &disk.cache(),
        &[
            "--passthrough",
            "writes",
            "--write-back-delay",
            "5s",
            "--metrics-addr",
            &addr,
        ],
    )?;
    wait_for_log(&m, "reads and writes files being written")?;
    let failures = |m: &Mount| {
        m.log_text()
            .matches("could not write a staged file back")
            .count()
    };
    let wait_failures = |m: &Mount, n: usize| -> Result<()> {
        let t = std::time::Instant::now();
        while failures(m) < n {
            anyhow::ensure!(
                t.elapsed().as_secs() < 20,
                "the disk's failure was never seen:\n{}",
                m.log_tail(20)
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Ok(())
    };

    // The disk fails while a file is written and closed, and works again once the commit was
    // told (meanwhile the journal cannot be made durable either, and every upload waits).
    disk.fail()?;
    let kept = random_bytes(MIB, 51);
    bucketdrive_tests::write_and_close(&m.path().join("g.bin"), &kept)
        .map_err(|e| anyhow::anyhow!("g.bin: {e}"))?;
    wait_failures(&m, 1)?;
    disk.heal()?;
    wait_for_object(&emu, "pte", "g.bin", &sha256(&kept), 30)
        .map_err(|e| anyhow::anyhow!("{e}:\n{}", m.log_tail(30)))?;

    // The same, and the page cache lets go of the file's pages before its upload reads them.
    disk.fail()?;
    let lost = random_bytes(8 * MIB, 52);
    let closed = bucketdrive_tests::write_and_close(&m.path().join("f.bin"), &lost);
    assert_eq!(metric(&addr, OPENS)?, 2.0, "both files passed through");
    wait_failures(&m, 2).map_err(|e| anyhow::anyhow!("{e} (close: {closed:?})"))?;
    bucketdrive_tests::drop_page_cache().map_err(|e| anyhow::anyhow!("drop: {e}"))?;
    disk.heal()?;
    std::thread::sleep(std::time::Duration::from_secs(8));
    let now = sha256(&emu.get("pte", "f.bin")?);
    assert!(
        now == sha256(&good),
        "the bucket keeps the last whole version (it has {}):\n{}",
        if now == sha256(&lost) {
            "the bytes written"
        } else {
            "other bytes"
        },
        m.log_tail(30)
    );

    let again = random_bytes(3 * MIB, 53);
    bucketdrive_tests::write_and_close(&m.path().join("f.bin"), &again)
        .map_err(|e| anyhow::anyhow!("f.bin again: {e}:\n{}", m.log_tail(30)))?;
    wait_for_object(&emu, "pte", "f.bin", &sha256(&again), 60)?;
    m.unmount()?;
    assert_eq!(sha256(&emu.get("pte", "f.bin")?), sha256(&again));
    assert_eq!(sha256(&emu.get("pte", "g.bin")?), sha256(&kept));
    Ok(())
}
