fn main() {
    std::process::exit(duet::cli::main(std::env::args().skip(1).collect()));
}
