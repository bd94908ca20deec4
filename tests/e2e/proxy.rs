//! The link proxy's own behaviour, checked with plain HTTP requests through it (no mount).
//!
//! The emulator answers 200 to a compose and to a media upload whose `ifGenerationMatch` does
//! not hold; with `--enforce-preconditions` the proxy answers 412 for it, so that a test can see
//! a write that would replace another writer's object refused, and it serialises the writes to
//! one object name so that writers racing with the same expected generation see one win.

use bucketdrive_tests::{encode_path, random_bytes, Emulator, Proxy, Result};

const BUCKET: &str = "preconditions";

/// The status of an answer, error statuses included.
fn status(r: std::result::Result<ureq::Response, ureq::Error>) -> Result<u16> {
    match r {
        Ok(resp) => Ok(resp.status()),
        Err(ureq::Error::Status(code, _)) => Ok(code),
        Err(e) => Err(e.into()),
    }
}

/// The generation of `key`, which must exist.
fn generation(emu: &Emulator, key: &str) -> Result<u64> {
    let g = emu
        .generation(BUCKET, key)?
        .ok_or_else(|| anyhow::anyhow!("{key} has no generation"))?;
    Ok(g.parse()?)
}

/// Sends requests through the proxy.
struct Client {
    agent: ureq::Agent,
    base: String,
}

impl Client {
    /// A media upload of `data` to `key` with `ifGenerationMatch=gen`.
    fn upload(&self, key: &str, gen: u64, data: &[u8]) -> Result<u16> {
        status(
            self.agent
                .post(&format!("{}/upload/storage/v1/b/{BUCKET}/o", self.base))
                .query("uploadType", "media")
                .query("name", key)
                .query("ifGenerationMatch", &gen.to_string())
                .send_bytes(data),
        )
    }

    /// Composes `sources` into `dest` with `ifGenerationMatch=gen`.
    fn compose(&self, sources: &[&str], dest: &str, gen: u64) -> Result<u16> {
        let sources: Vec<_> = sources
            .iter()
            .map(|s| serde_json::json!({ "name": s }))
            .collect();
        status(
            self.agent
                .post(&format!(
                    "{}/storage/v1/b/{BUCKET}/o/{}/compose",
                    self.base,
                    encode_path(dest)
                ))
                .query("ifGenerationMatch", &gen.to_string())
                .set("Content-Type", "application/json")
                .send_string(&serde_json::json!({ "sourceObjects": sources }).to_string()),
        )
    }
}

#[test]
fn proxy_enforces_generation_preconditions_on_compose_and_media_uploads() -> Result<()> {
    let emu = Emulator::start()?;
    emu.create_bucket(BUCKET)?;
    let proxy = Proxy::start(&emu, &["--latency", "0ms", "--enforce-preconditions"])?;
    let client = Client {
        agent: ureq::AgentBuilder::new().build(),
        base: proxy.url(),
    };
    let key = "dir/the object";
    emu.put(BUCKET, key, b"first")?;
    emu.put(BUCKET, "part", b"second")?;
    let gen = generation(&emu, key)?;
    let unchanged = |what: &str| -> Result<()> {
        let got = emu.get(BUCKET, key)?;
        anyhow::ensure!(
            got == b"first" && generation(&emu, key)? == gen,
            "{what} changed the object: now {:?}",
            String::from_utf8_lossy(&got)
        );
        Ok(())
    };

    // A wrong generation, or "must not exist" for an object that does: refused, nothing written.
    assert_eq!(
        client.upload(key, gen + 1, b"stale")?,
        412,
        "media, wrong gen"
    );
    unchanged("a media upload with a wrong generation")?;
    assert_eq!(client.upload(key, 0, b"stale")?, 412, "media, gen 0");
    unchanged("a media upload with ifGenerationMatch=0")?;
    // A body larger than the socket buffers is still answered 412, not reset.
    let big = random_bytes(4 * 1024 * 1024, 1);
    assert_eq!(client.upload(key, gen + 1, &big)?, 412, "big media");
    unchanged("a large media upload with a wrong generation")?;
    assert_eq!(client.compose(&["part"], key, gen + 1)?, 412, "compose");
    unchanged("a compose with a wrong generation")?;
    assert_eq!(client.compose(&["part"], key, 0)?, 412, "compose, gen 0");
    unchanged("a compose with ifGenerationMatch=0")?;

    // The right generation: written. (The emulator keeps the generation of an object a compose
    // replaces, so an upload moves the generation on first.)
    assert_eq!(client.upload(key, gen, b"third")?, 200, "media, right gen");
    assert_eq!(emu.get(BUCKET, key)?, b"third");
    let uploaded = generation(&emu, key)?;
    assert_ne!(uploaded, gen, "an upload left the generation as it was");
    assert_eq!(client.upload(key, gen, b"stale")?, 412, "media, old gen");
    assert_eq!(
        client.compose(&["part"], key, uploaded)?,
        200,
        "compose, right gen"
    );
    assert_eq!(emu.get(BUCKET, key)?, b"second");
    // "Must not exist" holds for a new name.
    assert_eq!(client.upload("new", 0, b"fresh")?, 200, "media, gen 0, new");
    assert_eq!(
        client.compose(&["part"], "new too", 0)?,
        200,
        "compose, new"
    );
    assert_eq!(emu.get(BUCKET, "new too")?, b"second");

    let stats = proxy.stats()?;
    eprintln!("proxy: {stats}");
    assert!(
        stats.contains("10 checked, 6 answered 412"),
        "the proxy's counts are off: {stats}"
    );
    Ok(())
}

#[test]
fn proxy_serialises_conditional_writes_to_one_object() -> Result<()> {
    let emu = Emulator::start()?;
    emu.create_bucket(BUCKET)?;
    let proxy = Proxy::start(&emu, &["--latency", "0ms", "--enforce-preconditions"])?;
    let key = "contended";
    emu.put(BUCKET, key, b"first")?;
    let gen = generation(&emu, key)?;
    // Writers racing with the same expected generation: the check and the write of each are
    // one step, so exactly one of them wins.
    let statuses = std::thread::scope(|s| {
        let writers: Vec<_> = (0..8u8)
            .map(|i| {
                let base = proxy.url();
                s.spawn(move || {
                    let client = Client {
                        agent: ureq::AgentBuilder::new().build(),
                        base,
                    };
                    client.upload(key, gen, &[b'a' + i; 64 * 1024])
                })
            })
            .collect();
        writers
            .into_iter()
            .map(|w| w.join().map_err(|_| anyhow::anyhow!("a writer panicked"))?)
            .collect::<Result<Vec<u16>>>()
    })?;
    let won = statuses.iter().filter(|&&s| s == 200).count();
    let refused = statuses.iter().filter(|&&s| s == 412).count();
    assert_eq!((won, refused), (1, 7), "statuses: {statuses:?}");
    Ok(())
}
