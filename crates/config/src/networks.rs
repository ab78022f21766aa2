//! IP networks as written in the config: a CIDR such as `10.0.0.0/8`, or a bare address (a network
//! of one).

use ipnet::IpNet;

/// `text` as a network; the error says what was expected.
pub(crate) fn network(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    let parsed = text
        .parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<std::net::IpAddr>().ok().map(IpNet::from));
    parsed.ok_or_else(|| {
        format!(
            "`{text}` is not an address or network: expected an IP such as 10.0.0.7 \
             or a CIDR such as 10.0.0.0/8"
        )
    })
}

/// An IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`) as the IPv4 network it is, since clients
/// are compared as IPv4 addresses then; any other network as it is.
pub(crate) fn canonical(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(net, IpNet::V4),
            None => net,
        },
        _ => net,
    }
}
