//! A route's `compress:`: defaults, what is written, each mistake located.

use duet_config::{filter::compress::Encoding, parse};

mod support;
use support::{errors, with_routes};

#[test]
fn defaults_and_what_is_written() {
    let yaml = with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, compress: {} }\n  \
         - { match: { path_prefix: /b }, cluster: web, compress: { encodings: [gzip, br], types: [text/*, Application/JSON], min_length: 4KiB, gzip_level: 9, brotli_level: 11, zstd_level: 19 } }",
    );
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let a = config.routes[0]
        .filters
        .compress
        .as_ref()
        .expect("compress");
    assert_eq!(
        a.encodings,
        [Encoding::Zstd, Encoding::Brotli, Encoding::Gzip]
    );
    assert!(a.types.iter().any(|t| t == "application/json"));
    assert!(!a.types.iter().any(|t| t == "text/event-stream"));
    assert_eq!(
        (a.min_length, a.gzip_level, a.brotli_level, a.zstd_level),
        (1024, 5, 4, 3)
    );
    let b = config.routes[1]
        .filters
        .compress
        .as_ref()
        .expect("compress");
    assert_eq!(b.encodings, [Encoding::Gzip, Encoding::Brotli]);
    assert_eq!(b.types, ["text/*", "application/json"]);
    assert_eq!(
        (b.min_length, b.gzip_level, b.brotli_level, b.zstd_level),
        (4096, 9, 11, 19)
    );
    assert!(config.routes[1]
        .describe_filters()
        .contains(" compress gzip,br min 4096 gzip 9 br 11 zstd 19"));
}

#[test]
fn an_unknown_coding_a_bad_type_a_level_out_of_range_and_a_route_answering_itself_are_located() {
    let found = errors(&with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, compress: { encodings: [gzip, deflate, gzip] } }\n  \
         - { match: { path_prefix: /b }, cluster: web, compress: { types: [html] } }\n  \
         - { match: { path_prefix: /c }, cluster: web, compress: { gzip_level: 10, zstd_level: 22 } }\n  \
         - { match: { path_prefix: /d }, respond: { body: ok }, compress: {} }",
    ));
    let starts = [
        "bad.yaml:3:79: routes[0].compress.encodings[1]: `deflate` is not a coding duet writes",
        "bad.yaml:3:88: routes[0].compress.encodings[2]: `gzip` is listed twice",
        "bad.yaml:4:69: routes[1].compress.types[0]: `html` is not a media type",
        "bad.yaml:5:73: routes[2].compress.gzip_level: 10 is out of range: expected 1 to 9",
        "bad.yaml:5:89: routes[2].compress.zstd_level: 22 is out of range: expected 1 to 19",
        "bad.yaml:6:68: routes[3].compress: the route answers itself",
    ];
    for start in starts {
        assert!(
            found.iter().any(|e| e.starts_with(start)),
            "{start}\n{found:#?}"
        );
    }
    assert_eq!(found.len(), 6, "{found:#?}");
}
