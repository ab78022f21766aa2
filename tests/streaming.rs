//! Bodies stream both ways: a 1 GiB download and a 1 GiB upload pass through duet while its resident
//! memory stays far below the body size.

use crate::support::Duet;
use bytes::Bytes;
use duet_testbed::config::DuetConfig;
use duet_testbed::{Backend, BackendOptions};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

const GIB: u64 = 1 << 30;
/// Far below the body size: a buffered body would need at least 1 GiB.
const RSS_LIMIT_KIB: u64 = 96 * 1024;

/// A body of `remaining` bytes made on the fly, 256 KiB at a time.
struct Generated {
    remaining: u64,
    chunk: Bytes,
}

impl http_body::Body for Generated {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = self.remaining.min(self.chunk.len() as u64);
        self.remaining -= n;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n as usize)))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_each_way_with_bounded_memory() {
    let backend = Backend::start(BackendOptions::named("bulk")).expect("backend");
    let duet = Duet::start_with(
        &DuetConfig::single("p2c_inflight", &[backend.address()]).to_yaml(),
        "warn,duet::cli=info",
    );
    let client = Client::builder(TokioExecutor::new()).build_http::<Generated>();

    let download = async {
        let request = http::Request::get(duet.url(&format!("/bytes/{GIB}")))
            .body(Generated {
                remaining: 0,
                chunk: Bytes::new(),
            })
            .expect("request");
        let response = client.request(request).await.expect("response");
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let mut received = 0u64;
        while let Some(frame) = body.frame().await {
            received += frame
                .expect("frame")
                .data_ref()
                .map_or(0, |d| d.len() as u64);
        }
        received
    };
    let received = tokio::time::timeout(Duration::from_secs(240), download)
        .await
        .expect("download in time");
    assert_eq!(received, GIB);

    let upload = async {
        let body = Generated {
            remaining: GIB,
            chunk: Bytes::from(vec![b'u'; 256 * 1024]),
        };
        let request = http::Request::post(duet.url("/upload"))
            .body(body)
            .expect("request");
        let response = client.request(request).await.expect("response");
        assert_eq!(response.status(), 200);
        response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
    };
    let counted = tokio::time::timeout(Duration::from_secs(240), upload)
        .await
        .expect("upload in time");
    assert_eq!(
        counted,
        GIB.to_string().as_bytes(),
        "the backend read every byte"
    );

    let peak = duet.peak_rss_kib();
    eprintln!("duet peak RSS after 1 GiB down and 1 GiB up: {peak} KiB");
    assert!(peak > 0, "could not read duet's memory");
    assert!(
        peak < RSS_LIMIT_KIB,
        "duet peaked at {peak} KiB for 1 GiB bodies"
    );
}
