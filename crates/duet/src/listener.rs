//! Listening sockets: one per worker per configured address, all bound with `SO_REUSEPORT` so the
//! kernel spreads connections over the workers.

use socket2::{Domain, Protocol, Socket, Type};
use std::{io, net::SocketAddr};

/// Binds `count` sockets to `address` with `SO_REUSEPORT`. Port 0 is resolved by the first bind and
/// the rest join it, so every worker listens on the same port. Returns the bound address and sockets.
pub(crate) fn bind_reuseport(
    address: SocketAddr,
    count: usize,
) -> io::Result<(SocketAddr, Vec<std::net::TcpListener>)> {
    let mut sockets = Vec::with_capacity(count);
    let mut bound = address;
    for _ in 0..count.max(1) {
        let socket = Socket::new(
            Domain::for_address(bound),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.set_tcp_nodelay(true)?;
        socket.set_nonblocking(true)?;
        socket
            .bind(&bound.into())
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {bound}: {e}")))?;
        socket.listen(1024)?;
        if bound.port() == 0 {
            bound = socket
                .local_addr()?
                .as_socket()
                .ok_or_else(|| io::Error::other("listener has no IP address"))?;
        }
        sockets.push(socket.into());
    }
    Ok((bound, sockets))
}
