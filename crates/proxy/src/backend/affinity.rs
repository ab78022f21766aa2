//! A request's affinity key for `policy: hash`: the part of the request `hash.key` names, hashed with
//! no seed so that every worker and every instance agrees on it.

use duet_balance::algo::stable_hash;
use duet_config::HashKey;
use http::{header, request::Parts};
use std::net::IpAddr;

/// The hash of the request's `key`, `None` when the request has none (it then goes by P2C). Read from
/// the request as it will be sent (after the route's filters), `client` is the peer's address.
pub(crate) fn key_hash(key: &HashKey, parts: &Parts, client: IpAddr) -> Option<u64> {
    match key {
        HashKey::Header(name) => parts
            .headers
            .get(name.as_str())
            .map(|value| stable_hash(value.as_bytes())),
        HashKey::Cookie(name) => parts
            .headers
            .get_all(header::COOKIE)
            .iter()
            .flat_map(|value| value.as_bytes().split(|&b| b == b';'))
            .find_map(|pair| value_of(pair.trim_ascii(), name))
            .map(stable_hash),
        HashKey::Query(name) => parts
            .uri
            .query()?
            .split('&')
            .find_map(|pair| value_of(pair.as_bytes(), name))
            .map(stable_hash),
        HashKey::ClientIp => Some(stable_hash(&client)),
        HashKey::Path => Some(stable_hash(parts.uri.path().as_bytes())),
    }
}

/// The value of `pair` (`name=value`) if its name is `name`.
fn value_of<'a>(pair: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let rest = pair.strip_prefix(name.as_bytes())?;
    rest.strip_prefix(b"=")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut request = http::Request::builder().uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
            .body(())
            .map(|r| r.into_parts().0)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn each_key_reads_its_part_and_a_missing_one_is_none() {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let request = parts(
            "/a/b?x=1&user=u42&y",
            &[
                ("x-user", "u42"),
                ("cookie", "a=1; sid=u42"),
                ("cookie", "b=2"),
            ],
        );
        let u42 = Some(stable_hash(b"u42".as_slice()));
        let hash = |key: HashKey| key_hash(&key, &request, ip);
        assert_eq!(hash(HashKey::Header("x-user".into())), u42);
        assert_eq!(hash(HashKey::Cookie("sid".into())), u42);
        assert_eq!(hash(HashKey::Query("user".into())), u42);
        assert_eq!(hash(HashKey::Path), Some(stable_hash(b"/a/b".as_slice())));
        assert_eq!(hash(HashKey::ClientIp), Some(stable_hash(&ip)));
        assert_eq!(hash(HashKey::Header("x-other".into())), None);
        assert_eq!(hash(HashKey::Cookie("si".into())), None);
        assert_eq!(hash(HashKey::Query("use".into())), None);
        let bare = parts("/", &[]);
        assert_eq!(key_hash(&HashKey::Query("user".into()), &bare, ip), None);
    }
}
