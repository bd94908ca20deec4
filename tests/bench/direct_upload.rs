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
    #[arg(long)]
    file: PathBuf,
    #[arg(long, default_value_t = 32 << 20)]
    part_size: u64,
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let opts = GcsOptions::resolve(Some(args.endpoint.clone()), None, true);
    let store = Arc::new(GcsStore::connect(&args.bucket, &opts).await?);
    let file = Arc::new(std::fs::File::open(&args.file).context("opening the file")?);
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
        .buffered(args.concurrency)
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
