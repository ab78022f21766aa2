//! `duet probe URL`: one HTTP GET, for container health checks in an image with no shell or curl.

use std::{
    io::{Read, Write},
    net::{TcpStream, ToSocketAddrs},
    time::Duration,
};

/// The whole probe (resolve, connect, request, status line) must fit in this.
const DEADLINE: Duration = Duration::from_secs(2);

/// GETs `url` (`http://HOST[:PORT][/PATH]`); 0 on a 2xx status, 1 otherwise (the reason on stderr).
pub(crate) fn run(url: &str) -> i32 {
    match probe(url) {
        Ok(status) if (200..300).contains(&status) => 0,
        Ok(status) => {
            eprintln!("duet probe: {url} answered {status}");
            1
        }
        Err(error) => {
            eprintln!("duet probe: {url}: {error}");
            1
        }
    }
}

fn probe(url: &str) -> Result<u16, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or("only http:// URLs can be probed")?;
    let (authority, path) = match rest.find('/') {
        Some(slash) => rest.split_at(slash),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err("the URL has no host".into());
    }
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let address = with_port
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority} has no address"))?;
    let mut stream =
        TcpStream::connect_timeout(&address, DEADLINE).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(DEADLINE))
        .and_then(|()| stream.set_write_timeout(Some(DEADLINE)))
        .map_err(|e| e.to_string())?;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nUser-Agent: duet-probe\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    // The status line is all that is needed: "HTTP/1.1 200 OK".
    let mut head = [0u8; 64];
    let mut filled = 0;
    while filled < 12 {
        match stream.read(&mut head[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    let line = String::from_utf8_lossy(&head[..filled]);
    line.strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|status| status.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {line:?}"))
}

#[cfg(test)]
mod tests {
    use super::probe;
    use std::{io::Write, net::TcpListener};

    fn answer_once(response: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        std::thread::spawn(move || {
            if let Ok((mut stream, _)) = listener.accept() {
                let mut buffer = [0u8; 1024];
                let _ = std::io::Read::read(&mut stream, &mut buffer);
                let _ = stream.write_all(response.as_bytes());
            }
        });
        format!("http://{address}/healthz")
    }

    #[test]
    fn a_probe_reads_the_status_and_refuses_what_it_cannot_reach() {
        assert_eq!(probe(&answer_once("HTTP/1.1 200 OK\r\n\r\n")), Ok(200));
        assert_eq!(
            probe(&answer_once("HTTP/1.1 503 Service Unavailable\r\n\r\n")),
            Ok(503)
        );
        assert!(probe(&answer_once("garbage")).is_err());
        assert!(probe("https://127.0.0.1/").is_err());
        assert!(probe("http:///healthz").is_err());
        let closed = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = closed.local_addr().expect("address");
        drop(closed);
        assert!(probe(&format!("http://{address}/"))
            .expect_err("nothing listens there")
            .starts_with("connect"));
    }
}
