//! The two-mount soak (I8, I9 end to end): two daemons mount one bucket, each with its own
//! cache directory as two machines have, and a third writer puts objects straight into the
//! bucket, all through one fault proxy that also enforces generation preconditions on the
//! requests the emulator lets through (compose, media uploads, copies, deletes). Either daemon
//! is killed and remounted now and then.
//!
//! What the mounts do: whole-file writes of a few shared names (straight, or saved as editors
//! do: a temporary file renamed over the name), whole-file writes and removals of names only
//! that mount uses, some past the composite threshold. The direct writer only creates
//! (`ifGenerationMatch=0`), so it never replaces anything itself.
//!
//! What must hold at the end, after both mounts drained:
//! - every object is whole: exactly one version someone wrote, under its name, the name its
//!   editor save renamed it to, or a conflict copy of either (nothing half-written, nothing
//!   nobody wrote);
//! - every acknowledged version is in the bucket, unless its own writer later wrote that name
//!   again, or another mount later wrote it (it may have seen the version, and then may replace
//!   it: I8 lets a mount replace what it saw);
//! - a name only one mount uses holds its last acknowledged version (or is gone when its last
//!   acknowledged change removed it), or a later version whose outcome was unknown.
//!
//! `SOAK2_SEED` runs one seed, else `SOAK2_SEEDS` runs seeds 1 to N (default 2); `SOAK2_OPS`
//! steps per seed (default 50).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bucketdrive_tests::Mount;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{env_number, soak_mount_args, soak_proxy_args, Rig, Watchdog, STEP_LIMIT};

const SHARED: [&str; 3] = ["s0", "s1", "s2"];
const PRIVATE: usize = 3;

/// One version someone wrote: who, where, and the bytes.
struct Version {
    writer: usize,
    name: String,
    /// Where an editor save renamed it to (only when the rename was tried).
    target: Option<String>,
    /// The editor save's rename returned success: its source name must be gone.
    renamed: bool,
    data: Vec<u8>,
    acked: bool,
    /// Step at which it was written.
    step: usize,
}

struct Machine {
    cache: tempfile::TempDir,
    mount: Option<Mount>,
}

struct Soak2<'a> {
    rig: &'a Rig,
    dog: &'a Watchdog,
    machines: Vec<Machine>,
    rng: StdRng,
    versions: Vec<Version>,
    /// For each private name: the states the bucket may end in (None: absent).
    private: BTreeMap<String, Vec<Option<Vec<u8>>>>,
    log: Vec<String>,
    kills: usize,
    direct: ureq::Agent,
}

/// The bytes of version `seq` of `writer`: a header naming both, then a pattern.
fn content(rng: &mut StdRng, writer: usize, seq: usize) -> Vec<u8> {
    let len = if rng.gen_bool(0.1) {
        rng.gen_range(1_100_000..2_200_000)
    } else {
        rng.gen_range(0..40_000)
    };
    let mut v = format!("w{writer}:v{seq}:").into_bytes();
    let salt: u8 = rng.gen();
    v.extend((0..len).map(|i: usize| (i as u8).wrapping_mul(13).wrapping_add(salt)));
    v
}

fn short(d: &[u8]) -> String {
    let head: String = d
        .iter()
        .take(12)
        .map(|&b| if b.is_ascii_graphic() { b as char } else { '.' })
        .collect();
    format!("{}B {head}", d.len())
}

/// Whether `key` is `name` or one of its conflict copies.
fn is_name_or_copy(key: &str, name: &str) -> bool {
    key == name
        || key
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(".conflict-"))
}

impl Soak2<'_> {
    fn mount_path(&self, m: usize) -> Result<PathBuf, anyhow::Error> {
        Ok(self.machines[m]
            .mount
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("mount {m} is not mounted"))?
            .path()
            .to_path_buf())
    }

    fn pid(&self, m: usize) -> Option<u32> {
        self.machines[m].mount.as_ref().and_then(Mount::pid)
    }

    /// Mounts machine `m`: the first has the kernel write files itself (`--passthrough
    /// writes`), the second writes through the daemon (`off`), so both write paths meet.
    fn mount(&mut self, m: usize) -> anyhow::Result<()> {
        let mount = Mount::with_endpoint(
            &self.rig.proxy.url(),
            &self.rig.bucket,
            self.machines[m].cache.path(),
            &soak_mount_args(m == 0),
        )?;
        self.machines[m].mount = Some(mount);
        Ok(())
    }

    /// Writes `data` whole at `name` on mount `m`; returns whether close() acknowledged it.
    fn write_file(&self, m: usize, name: &str, data: &[u8]) -> anyhow::Result<bool> {
        let path = self.mount_path(m)?.join(name);
        let r = self.dog.guard(self.pid(m), STEP_LIMIT, "a write", || {
            std::fs::write(&path, data)
        })?;
        Ok(r.is_ok())
    }

    /// Step `n`: mount `m` writes `data` whole at `name`, and the version is recorded.
    fn write_whole(
        &mut self,
        n: usize,
        m: usize,
        name: String,
        data: Vec<u8>,
    ) -> anyhow::Result<bool> {
        let ok = self.write_file(m, &name, &data)?;
        self.log.push(format!(
            "#{n} m{m} writes {name}: {} -> {}",
            short(&data),
            if ok { "ok" } else { "failed" }
        ));
        self.versions.push(Version {
            writer: m,
            name,
            target: None,
            data,
            acked: ok,
            renamed: false,
            step: n,
        });
        Ok(ok)
    }

    fn step(&mut self, n: usize) -> anyhow::Result<()> {
        let roll = self.rng.gen_range(0..100);
        let m = self.rng.gen_range(0..self.machines.len());
        let seq = self.versions.len();
        match roll {
            // A shared name, written straight or saved as an editor does.
            0..=44 => {
                let name = SHARED[self.rng.gen_range(0..SHARED.len())].to_string();
                let data = content(&mut self.rng, m, seq);
                if self.rng.gen_bool(0.4) {
                    let tmp = format!("{name}.tmp-m{m}");
                    let ok = self.write_file(m, &tmp, &data)?;
                    let renamed = ok && {
                        let dir = self.mount_path(m)?;
                        let r = self.dog.guard(self.pid(m), STEP_LIMIT, "a rename", || {
                            std::fs::rename(dir.join(&tmp), dir.join(&name))
                        })?;
                        r.is_ok()
                    };
                    self.log.push(format!(
                        "#{n} m{m} saves {name} via {tmp}: {} -> close {}, rename {}",
                        short(&data),
                        if ok { "ok" } else { "failed" },
                        if renamed { "ok" } else { "failed or skipped" }
                    ));
                    self.versions.push(Version {
                        writer: m,
                        name: tmp,
                        target: ok.then_some(name),
                        data,
                        acked: ok,
                        renamed,
                        step: n,
                    });
                } else {
                    self.write_whole(n, m, name, data)?;
                }
            }
            // A name only this mount uses: written whole, or removed.
            45..=74 => {
                let name = format!("m{m}-p{}", self.rng.gen_range(0..PRIVATE));
                if self.rng.gen_bool(0.25) {
                    let path = self.mount_path(m)?.join(&name);
                    let r = self.dog.guard(self.pid(m), STEP_LIMIT, "a remove", || {
                        std::fs::remove_file(&path)
                    })?;
                    let states = self.private.entry(name.clone()).or_insert(vec![None]);
                    match &r {
                        Ok(()) => *states = vec![None],
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                            anyhow::ensure!(
                                states.contains(&None),
                                "#{n} m{m} rm {name}: ENOENT, yet it was written and never removed"
                            );
                            *states = vec![None];
                        }
                        Err(_) => states.push(None),
                    }
                    self.log.push(format!("#{n} m{m} rm {name} -> {r:?}"));
                } else {
                    let data = content(&mut self.rng, m, seq);
                    let ok = self.write_whole(n, m, name.clone(), data.clone())?;
                    let states = self.private.entry(name).or_insert(vec![None]);
                    if ok {
                        *states = vec![Some(data)];
                    } else {
                        states.push(Some(data));
                    }
                }
            }
            // The direct writer creates a shared name if it is free.
            75..=89 => {
                let name = SHARED[self.rng.gen_range(0..SHARED.len())].to_string();
                let w = self.machines.len();
                let data = content(&mut self.rng, w, seq);
                let url = format!(
                    "{}/upload/storage/v1/b/{}/o",
                    self.rig.proxy.url(),
                    self.rig.bucket
                );
                let r = self
                    .direct
                    .post(&url)
                    .query("uploadType", "media")
                    .query("name", &name)
                    .query("ifGenerationMatch", "0")
                    .send_bytes(&data);
                let ok = r.is_ok();
                let what = match &r {
                    Ok(_) => "200".to_string(),
                    Err(ureq::Error::Status(s, _)) => s.to_string(),
                    Err(e) => format!("{e}"),
                };
                self.log.push(format!(
                    "#{n} direct writer creates {name}: {} -> {what}",
                    short(&data)
                ));
                self.versions.push(Version {
                    writer: w,
                    name,
                    target: None,
                    data,
                    acked: ok,
                    renamed: false,
                    step: n,
                });
            }
            // A pause, so uploads run and stat caches age.
            _ => {
                let ms = self.rng.gen_range(100..1500);
                std::thread::sleep(Duration::from_millis(ms));
                self.log.push(format!("#{n} sleep {ms}ms"));
            }
        }
        Ok(())
    }

    fn kill_and_remount(&mut self, n: usize) -> anyhow::Result<()> {
        let m = self.rng.gen_range(0..self.machines.len());
        if let Some(mount) = self.machines[m].mount.take() {
            mount.crash()?;
        }
        self.kills += 1;
        self.rig.proxy.faults(false)?;
        self.mount(m)?;
        self.rig.proxy.faults(true)?;
        self.log.push(format!("#{n} kill m{m} and remount"));
        Ok(())
    }

    /// The checks of the module doc, on the bucket after both mounts drained.
    fn check_end(&mut self) -> anyhow::Result<()> {
        self.rig.proxy.faults(false)?;
        for m in 0..self.machines.len() {
            let mount = self.machines[m]
                .mount
                .as_ref()
                .ok_or_else(|| anyhow::anyhow!("mount {m} is not mounted"))?;
            mount
                .wait_uploaded(Duration::from_secs(180))
                .map_err(|e| anyhow::anyhow!("mount {m}'s final drain did not finish: {e:#}"))?;
        }
        let objects = self.rig.emu.objects(&self.rig.bucket)?;
        let mut problems = Vec::new();
        // A run whose writes all failed would pass the checks below and prove nothing.
        let acked = self.versions.iter().filter(|v| v.acked).count();
        if acked * 2 < self.versions.len() {
            problems.push(format!(
                "only {acked} of {} versions were acknowledged: the link failed too much to test",
                self.versions.len()
            ));
        }
        let mut found: BTreeSet<usize> = BTreeSet::new();
        for (key, data) in &objects {
            if key.ends_with('/') {
                continue;
            }
            if key.starts_with(super::PARTS_PREFIX) {
                problems.push(format!("temporary part {key} left behind"));
                continue;
            }
            let conflict = key.contains(".conflict-");
            let whose: Vec<usize> = self
                .versions
                .iter()
                .enumerate()
                .filter(|(_, v)| {
                    v.data == *data
                        && (is_name_or_copy(key, &v.name)
                            || v.target.as_deref().is_some_and(|t| is_name_or_copy(key, t)))
                })
                .map(|(i, _)| i)
                .collect();
            // Only a mount makes conflict copies, of its own versions, and only of a name
            // someone else also writes; a renamed file's old name is gone.
            for &i in &whose {
                let v = &self.versions[i];
                if conflict && (v.writer >= self.machines.len() || v.name.contains("-p")) {
                    problems.push(format!(
                        "{key} is a conflict copy of {}, which nobody else writes to",
                        short(data)
                    ));
                }
                if v.renamed && *key == v.name {
                    problems.push(format!(
                        "{key} still holds {} after its rename to {:?} succeeded",
                        short(data),
                        v.target
                    ));
                }
            }
            if whose.is_empty() {
                problems.push(format!(
                    "{key} holds {}, which nobody wrote under that name",
                    short(data)
                ));
            }
            found.extend(whose);
        }
        for (i, v) in self.versions.iter().enumerate() {
            if !v.acked || found.contains(&i) {
                continue;
            }
            let dest = v.target.as_deref().unwrap_or(&v.name);
            let written_again = self.versions[i + 1..].iter().any(|w| {
                w.step > v.step
                    && w.writer < self.machines.len()
                    && (w.target.as_deref() == Some(dest) || w.name == dest)
            });
            let removed_by_owner = dest.starts_with(&format!("m{}-", v.writer))
                && self.private.get(dest).is_some_and(|s| s.contains(&None));
            if !written_again && !removed_by_owner {
                problems.push(format!(
                    "the acknowledged version {} of {dest} by writer {} (step {}) is nowhere in the bucket",
                    short(&v.data),
                    v.writer,
                    v.step
                ));
            }
        }
        for (name, states) in &self.private {
            let got = objects.get(name).cloned();
            if !states.contains(&got) {
                problems.push(format!(
                    "{name} ends as {}, expected one of [{}]",
                    got.as_deref().map_or("absent".to_string(), short),
                    states
                        .iter()
                        .map(|s| s.as_deref().map_or("absent".to_string(), short))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        anyhow::ensure!(
            problems.is_empty(),
            "at the end the bucket breaks I8/I9:\n  {}",
            problems.join("\n  ")
        );
        Ok(())
    }
}

fn soak2_seed(seed: u64, ops: usize, dog: &Watchdog) -> anyhow::Result<String> {
    let started = Instant::now();
    let mut args = soak_proxy_args(seed);
    args.push("--enforce-preconditions".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rig = Rig::new(&format!("soak2-{seed}"), &args)?;
    rig.proxy.faults(false)?;
    let mut soak = Soak2 {
        rig: &rig,
        dog,
        machines: Vec::new(),
        rng: StdRng::seed_from_u64(seed),
        versions: Vec::new(),
        private: BTreeMap::new(),
        log: Vec::new(),
        kills: 0,
        direct: ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(10))
            .build(),
    };
    for _ in 0..2 {
        soak.machines.push(Machine {
            cache: tempfile::Builder::new().prefix("bd-cache").tempdir()?,
            mount: None,
        });
    }
    let result = (|| {
        soak.mount(0)?;
        soak.mount(1)?;
        rig.proxy.faults(true)?;
        let mut next_kill = soak.rng.gen_range(8..=14);
        for n in 0..ops {
            if n == next_kill {
                soak.kill_and_remount(n)?;
                next_kill = n + soak.rng.gen_range(8..=14);
            }
            soak.step(n)?;
        }
        soak.check_end()
    })();
    let acked = soak.versions.iter().filter(|v| v.acked).count();
    let summary = format!(
        "seed {seed}: {ops} steps, {} versions written ({acked} acknowledged), {} kills, {:.1?}; link: {}",
        soak.versions.len(),
        soak.kills,
        started.elapsed(),
        rig.proxy.stats().unwrap_or_else(|e| e.to_string())
    );
    let mut logs = String::new();
    for (m, machine) in soak.machines.iter_mut().enumerate() {
        if let Some(mount) = machine.mount.take() {
            if result.is_err() {
                logs.push_str(&format!(
                    "mount {m} log (last lines):\n{}",
                    mount.log_tail(30)
                ));
                let _ = mount.crash();
            } else {
                mount.unmount()?;
            }
        }
    }
    match result {
        Ok(()) => Ok(summary),
        Err(e) => Err(anyhow::anyhow!(
            "{summary}\n{e:#}\nsteps:\n  {}\n{logs}replay with SOAK2_SEED={seed} SOAK2_OPS={ops}",
            soak.log.join("\n  ")
        )),
    }
}

#[test]
fn soak_two_mounts_and_a_direct_writer() -> anyhow::Result<()> {
    let _serial = super::serial();
    let ops = env_number("SOAK2_OPS", 50)? as usize;
    let seeds: Vec<u64> = match std::env::var("SOAK2_SEED") {
        Ok(_) => vec![env_number("SOAK2_SEED", 0)?],
        Err(_) => (1..=env_number("SOAK2_SEEDS", 2)?).collect(),
    };
    let failures = super::run_seeds("soak2", &seeds, |seed, dog| soak2_seed(seed, ops, dog));
    anyhow::ensure!(
        failures.is_empty(),
        "two-mount soak seeds {failures:?} failed (details above)"
    );
    Ok(())
}
