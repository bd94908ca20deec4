//! The process's TLS crypto provider.
//!
//! rustls needs one crypto provider. `gcloud-storage` links `ring` whatever its features, so
//! the workspace builds reqwest's rustls without a provider (`rustls-no-provider`) and installs
//! ring here, instead of also building `aws-lc-rs` (reqwest's default) with its C toolchain.
//! reqwest takes the process default when a client is built, including the clients
//! `gcloud-auth` builds for tokens, so this must run before any of them: [`GcsStore::connect`]
//! calls it first.
//!
//! [`GcsStore::connect`]: super::gcs::GcsStore::connect

/// Makes ring the process's default rustls crypto provider, once. Safe to call repeatedly: if a
/// provider is installed already (by an earlier call, or by a program embedding the core),
/// that one is kept.
pub fn install_crypto_provider() {
    // Err only means a default exists already, which is all this needs.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::install_crypto_provider;

    /// Without a provider, building a reqwest client panics; with ring installed it builds and
    /// starts a TLS handshake: the first bytes it sends are a handshake record (a ClientHello).
    #[tokio::test]
    async fn client_builds_and_sends_a_client_hello() {
        install_crypto_provider();
        install_crypto_provider();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(5))
            .build()
            .expect("client builds with the ring provider");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.expect("accept");
            let mut head = [0u8; 3];
            conn.read_exact(&mut head)
                .await
                .expect("read record header");
            head
        });
        // The server closes after reading, so the request itself fails; only the hello matters.
        let _ = client
            .get(format!("https://127.0.0.1:{port}/"))
            .send()
            .await;
        let head = server.await.expect("server task");
        assert_eq!(head[0], 0x16, "TLS handshake record");
        assert_eq!(head[1], 0x03, "TLS major version");
    }
}
