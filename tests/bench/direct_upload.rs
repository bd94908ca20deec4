//! `direct-upload`: the baseline for the write benchmark. It uploads one local file straight to
//! the bucket with the GCS client, the way a well-tuned uploader would without a filesystem in
//! between: parts of `--part-size` sent `--concurrency` at a time as temporary objects, composed
//! into the final object (32 sources per compose), temporaries deleted. It prints the seconds
//! the upload took.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use fs_core::store::gcs::{GcsOptions, GcsStore};
use fs_core::store::{ObjectStore, Precondition, WriteOptions};
use futures::stream::{self, StreamExt, TryStreamExt};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long)]
    endpoint: String,
    #[arg(long)]
    bucket: String,
    #[arg(long)]
    key: String,
    /// The file to upload (one object, in parts).
    #[arg(long, required_unless_present = "dir")]
    file: Option<PathBuf>,
    /// A directory whose files are uploaded one request each, under `<key>/`.
    #[arg(long, conflicts_with = "file")]
    dir: Option<PathBuf>,
    #[arg(long, default_value_t = 32 << 20)]
    part_size: u64,
    /// Requests at once: 8 parts of one file, or 32 small files with `--dir`.
    #[arg(long)]
    concurrency: Option<usize>,
}

/// Uploads every file of `dir` to `<prefix>/<name>`, `concurrency` at a time.
async fn upload_dir(
    store: Arc<GcsStore>,
    dir: &std::path::Path,
    prefix: &str,
    concurrency: usize,
) -> anyhow::Result<f64> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    let start = Instant::now();
    stream::iter(files)
        .map(|path| {
            let store = store.clone();
            async move {
                let data = tokio::fs::read(&path).await?;
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .context("a file name that is not UTF-8")?;
                store
                    .put(
                        &format!("{prefix}/{name}"),
                        Bytes::from(data),
                        Precondition::DoesNotExist,
                        &WriteOptions::default(),
                    )
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(start.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let opts = GcsOptions::resolve(Some(args.endpoint.clone()), None, true, false)
        .map_err(anyhow::Error::msg)?;
    let store = Arc::new(GcsStore::connect(&args.bucket, &opts).await?);
    if let Some(dir) = &args.dir {
        let secs = upload_dir(store, dir, &args.key, args.concurrency.unwrap_or(32)).await?;
        println!("{secs:.3}");
        return Ok(());
    }
    let path = args.file.as_ref().context("--file or --dir")?;
    let file = Arc::new(std::fs::File::open(path).context("opening the file")?);
    let size = file.metadata()?.len();
    let parts = size.div_ceil(args.part_size).max(1);
    let start = Instant::now();

    let uploaded: Vec<(String, i64)> = stream::iter(0..parts)
        .map(|i| {
            let (store, file, key) = (store.clone(), file.clone(), args.key.clone());
            let off = i * args.part_size;
            let len = args.part_size.min(size - off) as usize;
            async move {
                let data = tokio::task::spawn_blocking(move || {
                    let mut buf = vec![0u8; len];
                    file.read_exact_at(&mut buf, off).map(|_| buf)
                })
                .await??;
                let part = format!(".direct-parts/{key}.{i}");
                let meta = store
                    .put(
                        &part,
                        Bytes::from(data),
                        Precondition::None,
                        &WriteOptions::default(),
                    )
                    .await?;
                anyhow::Ok((part, meta.generation))
            }
        })
        .buffered(args.concurrency.unwrap_or(8))
        .try_collect()
        .await?;

    let mut level = uploaded.clone();
    let mut temps = Vec::new();
    while level.len() > 32 {
        let mut next = Vec::new();
        for (j, group) in level.chunks(32).enumerate() {
            let key = format!(".direct-parts/{}.c{}.{j}", args.key, temps.len());
            let meta = store
                .compose(group, &key, Precondition::None, &WriteOptions::default())
                .await?;
            temps.push(key.clone());
            next.push((key, meta.generation));
        }
        level = next;
    }
    store
        .compose(
            &level,
            &args.key,
            Precondition::None,
            &WriteOptions::default(),
        )
        .await?;
    let secs = start.elapsed().as_secs_f64();
    for key in uploaded.iter().map(|(k, _)| k.clone()).chain(temps) {
        store.delete(&key, Precondition::None).await?;
    }
    println!("{secs:.3}");
    Ok(())
}
