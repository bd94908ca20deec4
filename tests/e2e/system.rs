//! End-to-end: bucketdrive run as a system mount. An ordinary user mounts through fusermount3,
//! root mounts for another user with `--allow-other`, `mount -t fuse.bucketdrive` takes fstab
//! options and `umount` ends it, and systemd hears `READY=1` only once the mount answers.
//! Every test checks bytes: read back through the mount, and in the bucket.
//!
//! Needs root (it creates a user and mounts), `/dev/fuse`, and `fusermount3` (Debian's
//! `fuse3`).

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bucketdrive_tests::{
    bucketdrive_bin, is_mounted, random_bytes, sha256, wait_for_object, Emulator, Result,
};

/// The ordinary user the tests act as; created when missing.
const USER: &str = "bucketdrive-e2e";

fn setup(bucket: &str) -> Result<(Emulator, Vec<u8>)> {
    let emu = Emulator::start()?;
    emu.create_bucket(bucket)?;
    let seed = random_bytes(3 * 1024 * 1024 + 17, 7);
    emu.put(bucket, "dir/seed.bin", &seed)?;
    Ok((emu, seed))
}

/// The test user's uid and gid, creating the user the first time.
fn test_user() -> Result<(u32, u32)> {
    let id = |flag: &str| -> Result<Option<u32>> {
        let out = Command::new("id").args([flag, USER]).output()?;
        Ok(out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
            .flatten())
    };
    if id("-u")?.is_none() {
        // Two tests may race to create it; the loser's failure is fine if the user exists.
        let _ = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/bin/sh", USER])
            .status();
    }
    match (id("-u")?, id("-g")?) {
        (Some(u), Some(g)) => Ok((u, g)),
        _ => anyhow::bail!("cannot create the test user {USER} (useradd)"),
    }
}

/// fusermount3 opens /dev/fuse with the user's rights, so ordinary users need it world
/// read-write: Debian's udev rules give it mode 0666, a bare container may not.
fn allow_users_on_dev_fuse() -> Result<()> {
    let mode = std::fs::metadata("/dev/fuse")?.permissions().mode();
    if mode & 0o006 != 0o006 {
        std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(0o20666))?;
    }
    Ok(())
}

/// A scratch directory any user can traverse, holding a copy of the binary (the build tree
/// may not be readable by the test user), a mountpoint and a cache directory owned by `owner`.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new(owner: Option<(u32, u32)>) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("bd-system").tempdir()?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let bin = dir.path().join("bucketdrive");
        std::fs::copy(bucketdrive_bin(), &bin)?;
        // Until a child that another test's thread forked while the copy was open has run
        // its own program, the copy is still open for writing in that child, and running it
        // fails with ETXTBSY. That lasts a moment: wait it out here, once.
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(e) = Command::new(&bin).arg("--version").output() {
            if e.raw_os_error() != Some(libc::ETXTBSY) || Instant::now() > deadline {
                return Err(e.into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for sub in ["mnt", "cache", "logs", "home"] {
            let p = dir.path().join(sub);
            std::fs::create_dir(&p)?;
            if let Some((u, g)) = owner {
                std::os::unix::fs::chown(&p, Some(u), Some(g))?;
            }
        }
        Ok(Scratch { dir })
    }
    fn bin(&self) -> PathBuf {
        self.dir.path().join("bucketdrive")
    }
    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
    fn cache(&self) -> PathBuf {
        self.dir.path().join("cache").join("c")
    }
    fn log(&self) -> PathBuf {
        self.dir.path().join("logs").join("bucketdrive.log")
    }
    /// `bucketdrive mount BUCKET <mnt>` against `emu`, staging in this scratch's cache, as root.
    fn mount_cmd(&self, emu: &Emulator, bucket: &str) -> Command {
        let mut c = Command::new(self.bin());
        c.args(["mount", bucket])
            .arg(self.mnt())
            .args(["--endpoint", &emu.url(), "--anonymous", "--cache-dir"])
            .arg(self.cache());
        c
    }
    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }
}

/// Takes down whatever is still mounted on the path when dropped, even during a panic: root
/// may unmount any user's FUSE mount, and a lazy unmount ends its daemon's session.
struct Unmounter(PathBuf);

impl Drop for Unmounter {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
        if is_mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// Runs `program args…` as the test user, with `stdin` fed to it, and waits up to a minute.
fn as_user(s: &Scratch, program: &Path, args: &[&str], stdin: &[u8]) -> Result<Output> {
    // runuser sets HOME to the user's (here missing) home directory, so `env` sets it after.
    // A root session's runtime directory is not the user's, and without one the control
    // socket goes under the user's home, as for a mount started from cron or su.
    let mut child = Command::new("runuser")
        .args([
            "-u",
            USER,
            "--",
            "env",
            "-u",
            "XDG_RUNTIME_DIR",
            "-u",
            "XDG_CACHE_HOME",
        ])
        .arg(format!("HOME={}", s.dir.path().join("home").display()))
        .arg(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let input = stdin.to_vec();
    let feeder = child.stdin.take().map(|mut i| {
        std::thread::spawn(move || {
            let _ = i.write_all(&input);
        })
    });
    // A watchdog, so a hung mount fails the test instead of hanging it.
    let pid = child.id() as i32;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        if !flag.load(std::sync::atomic::Ordering::SeqCst) {
            // SAFETY: kill(2) on a child that has not been reaped yet (`done` is unset).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Some(f) = feeder {
        let _ = f.join();
    }
    let out = out?;
    anyhow::ensure!(
        out.status.code().is_some(),
        "{} {args:?} as {USER} did not finish ({})",
        program.display(),
        out.status
    );
    Ok(out)
}

fn ok(out: Output, what: &str) -> Result<Vec<u8>> {
    anyhow::ensure!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

/// The options field of the mount at `p` in /proc/self/mountinfo, with its type and source.
fn mountinfo(p: &Path) -> String {
    let want = p.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(want.as_str()))
        .unwrap_or_default()
        .to_string()
}

fn wait_unmounted(p: &Path, secs: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while is_mounted(p) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} is still mounted",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

#[test]
fn an_ordinary_user_mounts_reads_writes_and_unmounts() -> Result<()> {
    let (uid, gid) = test_user()?;
    allow_users_on_dev_fuse()?;
    let (emu, seed) = setup("usermount")?;
    let s = Scratch::new(Some((uid, gid)))?;
    let mnt = s.mnt();
    let _guard = Unmounter(mnt.clone());
    let (mnt_s, cache_s, log_s) = (
        mnt.to_string_lossy().to_string(),
        s.cache().to_string_lossy().to_string(),
        s.log().to_string_lossy().to_string(),
    );
    let url = emu.url();
    let base = [
        "mount",
        "usermount",
        &mnt_s,
        "--endpoint",
        &url,
        "--anonymous",
        "--cache-dir",
        &cache_s,
        "--log-file",
        &log_s,
    ];

    // allow_other is refused with the reason, unless this machine's fuse.conf permits it.
    let fuse_conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    if !fuse_conf.lines().any(|l| l.trim() == "user_allow_other") {
        let out = as_user(&s, &s.bin(), &[&base[..], &["--allow-other"]].concat(), b"")?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "--allow-other mounted without fuse.conf"
        );
        assert!(err.contains("user_allow_other"), "unclear error: {err}");
        assert!(!is_mounted(&mnt));
    }

    // Detached by default: the command returns once the mount answers.
    ok(as_user(&s, &s.bin(), &base, b"")?, "mount as the user")?;
    let info = mountinfo(&mnt);
    assert!(info.contains("fuse.bucketdrive usermount"), "{info}");
    assert!(info.contains(&format!("user_id={uid}")), "{info}");

    let got = ok(
        as_user(
            &s,
            Path::new("/bin/cat"),
            &[&format!("{mnt_s}/dir/seed.bin")],
            b"",
        )?,
        "read",
    )?;
    assert_eq!(sha256(&got), sha256(&seed), "read back through the mount");
    let data = random_bytes(1024 * 1024 + 5, 8);
    ok(
        as_user(
            &s,
            Path::new("/bin/sh"),
            &["-c", &format!("cat > {mnt_s}/dir/new.bin")],
            &data,
        )?,
        "write",
    )?;
    let meta = std::fs::symlink_metadata(&mnt);
    // Without allow_root even root is kept out of a user's mount.
    assert_eq!(
        meta.as_ref().err().map(|e| e.kind()),
        Some(std::io::ErrorKind::PermissionDenied),
        "root must be refused: {meta:?}"
    );
    let listing = ok(
        as_user(
            &s,
            Path::new("/bin/ls"),
            &["-ln", &format!("{mnt_s}/dir")],
            b"",
        )?,
        "ls",
    )?;
    let listing = String::from_utf8_lossy(&listing);
    assert!(
        listing
            .lines()
            .filter(|l| l.ends_with(".bin"))
            .all(|l| l.split_whitespace().nth(2) == Some(&uid.to_string())),
        "files show the user as owner: {listing}"
    );

    // The user's own unmount uploads what is pending first, then takes the mount down.
    let out = ok(
        as_user(&s, &s.bin(), &["unmount", &mnt_s], b"")?,
        "unmount as the user",
    )?;
    wait_unmounted(&mnt, 10)?;
    let uploaded = emu.get_opt("usermount", "dir/new.bin")?;
    assert!(
        uploaded.as_deref().map(sha256) == Some(sha256(&data)),
        "not uploaded when unmount returned ({}); log:\n{}",
        String::from_utf8_lossy(&out),
        s.log_text()
    );
    assert!(s.log_text().contains("mounted"), "log: {}", s.log_text());
    Ok(())
}

#[test]
fn root_mounts_for_another_user_with_allow_other() -> Result<()> {
    let (uid, gid) = test_user()?;
    let (emu, seed) = setup("othermount")?;
    let s = Scratch::new(None)?;
    let mnt = s.mnt();
    let _guard = Unmounter(mnt.clone());
    let mnt_s = mnt.to_string_lossy().to_string();
    let out = s
        .mount_cmd(&emu, "othermount")
        .args(["--uid", &uid.to_string(), "--gid", &gid.to_string()])
        .arg("--allow-other")
        .output()?;
    ok(out, "root mount with --allow-other")?;
    assert!(
        mountinfo(&mnt).contains("allow_other"),
        "{}",
        mountinfo(&mnt)
    );

    // Files show the given owner, and that user reads and writes.
    let meta = std::fs::metadata(mnt.join("dir/seed.bin"))?;
    assert_eq!((meta.uid(), meta.gid()), (uid, gid));
    let got = ok(
        as_user(
            &s,
            Path::new("/bin/cat"),
            &[&format!("{mnt_s}/dir/seed.bin")],
            b"",
        )?,
        "read as the user",
    )?;
    assert_eq!(sha256(&got), sha256(&seed));
    let data = random_bytes(200_000, 9);
    ok(
        as_user(
            &s,
            Path::new("/bin/sh"),
            &["-c", &format!("cat > {mnt_s}/dir/theirs.bin")],
            &data,
        )?,
        "write as the user",
    )?;
    let made = std::fs::metadata(mnt.join("dir/theirs.bin"))?;
    assert_eq!((made.uid(), made.len()), (uid, data.len() as u64));

    let out = Command::new(s.bin()).arg("unmount").arg(&mnt).output()?;
    ok(out, "unmount")?;
    wait_unmounted(&mnt, 10)?;
    assert_eq!(
        sha256(&emu.get("othermount", "dir/theirs.bin")?),
        sha256(&data)
    );
    Ok(())
}

/// Makes `bucketdrive` the one `mount.fuse3` finds: mount(8) runs helpers with a minimal
/// `PATH`, so the binary under test is linked from /usr/local/bin for the test's duration.
/// One test at a time holds the link: another's would be removed under it.
struct OnDefaultPath {
    link: PathBuf,
    _one: std::sync::MutexGuard<'static, ()>,
}

impl OnDefaultPath {
    fn new(bin: &Path) -> Result<Self> {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let link = PathBuf::from("/usr/local/bin/bucketdrive");
        if let Ok(existing) = std::fs::symlink_metadata(&link) {
            anyhow::ensure!(
                existing.file_type().is_symlink(),
                "{} exists and is not ours; remove it to run this test",
                link.display()
            );
            std::fs::remove_file(&link)?;
        }
        std::fs::create_dir_all("/usr/local/bin")?;
        std::os::unix::fs::symlink(bin, &link)?;
        Ok(OnDefaultPath { link, _one: one })
    }
}

impl Drop for OnDefaultPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.link);
    }
}

fn mount_t(source: &str, mnt: &Path, options: &str) -> Result<Output> {
    Ok(Command::new("mount")
        .args(["-t", "fuse.bucketdrive", source])
        .arg(mnt)
        .args(["-o", options])
        .env_remove("STORAGE_EMULATOR_HOST")
        .output()?)
}

#[test]
fn mount_t_takes_fstab_options_and_umount_finishes_uploads() -> Result<()> {
    let (emu, seed) = setup("fstab")?;
    let s = Scratch::new(None)?;
    let _on_path = OnDefaultPath::new(&s.bin())?;
    let mnt = s.mnt();
    let _guard = Unmounter(mnt.clone());
    let common = format!(
        "endpoint={},anonymous,cache_dir={},log_file={}",
        emu.url(),
        s.cache().display(),
        s.log().display()
    );

    // An unknown option: one line naming it, a non-zero exit, nothing mounted.
    let out = mount_t("fstab", &mnt, &format!("{common},frobnicate=3"))?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "unknown option accepted");
    assert!(err.contains("unknown mount option \"frobnicate\""), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!is_mounted(&mnt));

    // What an fstab line carries for mount(8) and systemd is accepted and ignored. A long
    // write-back delay shows that umount itself gets pending uploads finished.
    let fstab_only = "rw,_netdev,nofail,noauto,auto,user,users,dev,suid,exec,\
                      x-systemd.automount,x-systemd.idle-timeout=60";
    let opts = format!("{common},{fstab_only},stat_ttl=5s,write_back_delay=10min,allow_other");
    ok(mount_t("fstab", &mnt, &opts)?, "mount -t fuse.bucketdrive")?;
    let info = mountinfo(&mnt);
    assert!(info.contains("fuse.bucketdrive fstab"), "{info}");
    assert!(info.contains("allow_other"), "{info}");
    let mut got = Vec::new();
    std::fs::File::open(mnt.join("dir/seed.bin"))?.read_to_end(&mut got)?;
    assert_eq!(sha256(&got), sha256(&seed));
    let data = random_bytes(2 * 1024 * 1024 + 3, 10);
    std::fs::write(mnt.join("fresh.bin"), &data)?;
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        emu.get_opt("fstab", "fresh.bin")?.is_none(),
        "uploaded before its write-back delay"
    );
    let out = Command::new("umount").arg(&mnt).output()?;
    ok(out, "umount")?;
    // The daemon finishes the pending upload after the unmount, then exits.
    wait_for_object(&emu, "fstab", "fresh.bin", &sha256(&data), 30)?;

    // `ro` mounts read-only: the kernel refuses writes.
    ok(mount_t("fstab", &mnt, &format!("{common},ro"))?, "mount ro")?;
    assert!(mountinfo(&mnt).contains(" ro,"), "{}", mountinfo(&mnt));
    let err = std::fs::write(mnt.join("nope.bin"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    ok(Command::new("umount").arg(&mnt).output()?, "umount ro")?;
    wait_unmounted(&mnt, 10)?;

    // The helper form directly, as mount.fuse3 runs it.
    let out = Command::new(s.bin())
        .arg("fstab")
        .arg(&mnt)
        .args(["-o", &format!("{common},_netdev")])
        .output()?;
    ok(out, "bucketdrive BUCKET DIR -o")?;
    assert!(is_mounted(&mnt));
    ok(Command::new("umount").arg(&mnt).output()?, "umount")?;
    wait_unmounted(&mnt, 10)?;
    Ok(())
}

/// fstab's `noexec` and `nosymfollow` narrow the mount as they do any other: the kernel
/// refuses to run a program from it and to follow its links (they used to be accepted and
/// dropped, so an fstab line that asked for them got a mount that allowed both). Mounted
/// again without them, the same program runs, so the refusal is the option's.
#[test]
fn fstab_noexec_and_nosymfollow_are_honoured() -> Result<()> {
    let (emu, _) = setup("noexec")?;
    emu.put("noexec", "run.sh", b"#!/bin/sh\necho ran\n")?;
    let s = Scratch::new(None)?;
    let _on_path = OnDefaultPath::new(&s.bin())?;
    let mnt = s.mnt();
    let _guard = Unmounter(mnt.clone());
    let common = format!(
        "endpoint={},anonymous,cache_dir={},log_file={},file_mode=755",
        emu.url(),
        s.cache().display(),
        s.log().display()
    );
    ok(
        mount_t("noexec", &mnt, &format!("{common},noexec,nosymfollow"))?,
        "mount",
    )?;
    let info = mountinfo(&mnt);
    assert!(
        info.contains("noexec") && info.contains("nosymfollow"),
        "{info}"
    );
    let err = Command::new(mnt.join("run.sh"))
        .output()
        .expect_err("a program ran from a noexec mount");
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    std::os::unix::fs::symlink("run.sh", mnt.join("link"))?;
    let err = std::fs::read(mnt.join("link")).expect_err("a link was followed");
    assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
    ok(Command::new("umount").arg(&mnt).output()?, "umount")?;
    wait_unmounted(&mnt, 10)?;

    ok(mount_t("noexec", &mnt, &common)?, "mount without them")?;
    let out = Command::new(mnt.join("run.sh")).output()?;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    assert_eq!(std::fs::read(mnt.join("link"))?, b"#!/bin/sh\necho ran\n");
    ok(Command::new("umount").arg(&mnt).output()?, "umount")?;
    wait_unmounted(&mnt, 10)?;
    Ok(())
}

/// The systemd unit's stop hook, `bucketdrive unmount --stale MOUNTPOINT`, detaches only a
/// bucketdrive mount whose daemon is gone. Another filesystem mounted at the unit's mountpoint
/// (here a tmpfs, standing for an NFS or ext4 mount at `/srv`) is left mounted, as is a live
/// bucketdrive mount; a killed daemon's dead mount is detached, so a restart finds the
/// mountpoint free. (The unit used `umount --lazy`, which detached whatever was there.)
#[test]
fn the_units_stop_hook_detaches_only_a_dead_bucketdrive_mount() -> Result<()> {
    let (emu, _) = setup("stale")?;
    let s = Scratch::new(None)?;
    let mnt = s.mnt();
    let _guard = Unmounter(mnt.clone());
    let stale = |what: &str| -> Result<String> {
        let out = Command::new(s.bin())
            .args(["unmount", "--stale"])
            .arg(&mnt)
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        anyhow::ensure!(
            out.status.success(),
            "{what}: unmount --stale failed: {err}"
        );
        Ok(err)
    };

    ok(
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "other"])
            .arg(&mnt)
            .output()?,
        "mount tmpfs",
    )?;
    std::fs::write(mnt.join("theirs"), b"on the other filesystem")?;
    let said = stale("a tmpfs")?;
    assert!(
        said.contains("tmpfs") && said.contains("left alone"),
        "{said}"
    );
    assert!(
        mountinfo(&mnt).contains(" - tmpfs "),
        "the tmpfs was detached"
    );
    assert_eq!(
        std::fs::read(mnt.join("theirs"))?,
        b"on the other filesystem"
    );
    ok(Command::new("umount").arg(&mnt).output()?, "umount tmpfs")?;

    let mut child = s
        .mount_cmd(&emu, "stale")
        .arg("--foreground")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !is_mounted(&mnt) {
        anyhow::ensure!(Instant::now() < deadline, "the mount did not appear");
        std::thread::sleep(Duration::from_millis(20));
    }
    let said = stale("a live mount")?;
    assert!(said.contains("still answers"), "{said}");
    assert!(is_mounted(&mnt), "a live mount was detached");
    child.kill()?;
    child.wait()?;
    let said = stale("a dead mount")?;
    assert!(said.contains("detached"), "{said}");
    wait_unmounted(&mnt, 10)?;
    Ok(())
}

#[test]
fn systemd_hears_ready_only_once_the_mount_answers() -> Result<()> {
    use std::os::unix::net::UnixDatagram;
    let (emu, seed) = setup("notify")?;
    let s = Scratch::new(None)?;
    let mnt = s.mnt();
    let _guard = Unmounter(mnt.clone());
    let sock_path = s.dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path)?;
    sock.set_read_timeout(Some(Duration::from_secs(30)))?;
    // No --foreground: under a service manager the process stays attached by itself.
    let mut child = s
        .mount_cmd(&emu, "notify")
        .env("NOTIFY_SOCKET", &sock_path)
        .env_remove("STORAGE_EMULATOR_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf)?;
    assert_eq!(&buf[..n], b"READY=1\n");
    // At READY the mount is there and answers, and the service's process is still the one
    // systemd started.
    assert!(is_mounted(&mnt), "READY before the mount exists");
    let names: Vec<String> = std::fs::read_dir(&mnt)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().to_string()))
        .collect::<std::io::Result<_>>()?;
    assert_eq!(names, ["dir"]);
    let got = std::fs::read(mnt.join("dir/seed.bin"))?;
    assert_eq!(sha256(&got), sha256(&seed));
    assert!(child.try_wait()?.is_none(), "the service process detached");
    let data = random_bytes(100_000, 11);
    std::fs::write(mnt.join("written.bin"), &data)?;

    // systemctl stop sends SIGTERM: STOPPING=1, then uploads finish and the process exits.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let n = sock.recv(&mut buf)?;
    assert_eq!(&buf[..n], b"STOPPING=1\n");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        anyhow::ensure!(Instant::now() < deadline, "did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err)?;
    }
    assert!(status.success(), "exit {status}: {err}");
    assert!(!is_mounted(&mnt));
    assert_eq!(sha256(&emu.get("notify", "written.bin")?), sha256(&data));
    // Its log went to standard error, where the journal collects it.
    assert!(err.contains("mounted"), "stderr: {err}");
    Ok(())
}

#[test]
fn an_inherited_notify_socket_does_not_keep_mount_attached() -> Result<()> {
    use std::os::unix::net::UnixDatagram;
    let (emu, _) = setup("inherited")?;
    let s = Scratch::new(None)?;
    let mnt = s.mnt();
    let _guard = Unmounter(mnt.clone());
    let sock_path = s.dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path)?;
    sock.set_nonblocking(true)?;
    // A mount run from a shell inside some notify service: systemd names that service's own
    // process in SYSTEMD_EXEC_PID, which is not us, so we detach as usual and say nothing.
    let out = s
        .mount_cmd(&emu, "inherited")
        .env("NOTIFY_SOCKET", &sock_path)
        .env("SYSTEMD_EXEC_PID", "1")
        .output()?;
    ok(out, "mount")?;
    assert!(is_mounted(&mnt), "detached and mounted");
    let mut buf = [0u8; 64];
    assert!(
        sock.recv(&mut buf).is_err(),
        "told a supervisor that is not ours"
    );
    ok(
        Command::new(s.bin()).arg("unmount").arg(&mnt).output()?,
        "unmount",
    )?;
    wait_unmounted(&mnt, 10)?;
    Ok(())
}

/// An ordinary user's mount cannot register backing files (FUSE passthrough needs
/// `CAP_SYS_ADMIN`): it says so at start-up and reads through the daemon, the same bytes.
#[test]
fn an_ordinary_users_mount_reads_without_passthrough() -> Result<()> {
    let (uid, gid) = test_user()?;
    allow_users_on_dev_fuse()?;
    let (emu, seed) = setup("userpthru")?;
    let s = Scratch::new(Some((uid, gid)))?;
    let mnt = s.mnt();
    let _guard = Unmounter(mnt.clone());
    let mnt_s = mnt.to_string_lossy().to_string();
    let rc = s.dir.path().join("cache").join("rc");
    let args = [
        "mount",
        "userpthru",
        &mnt_s,
        "--endpoint",
        &emu.url(),
        "--anonymous",
        "--read-only",
        "--cache-dir",
        &s.cache().to_string_lossy(),
        "--read-cache-dir",
        &rc.to_string_lossy(),
        "--log-file",
        &s.log().to_string_lossy(),
    ]
    .map(|a| a.to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(as_user(&s, &s.bin(), &args, b"")?, "mount as the user")?;
    for _ in 0..3 {
        let got = ok(
            as_user(
                &s,
                Path::new("/bin/cat"),
                &[&format!("{mnt_s}/dir/seed.bin")],
                b"",
            )?,
            "read",
        )?;
        assert_eq!(sha256(&got), sha256(&seed));
    }
    ok(as_user(&s, &s.bin(), &["unmount", &mnt_s], b"")?, "unmount")?;
    let log = s.log_text();
    assert!(
        log.contains("FUSE passthrough: off (it needs root"),
        "log: {log}"
    );
    wait_unmounted(&mnt, 10)
}
