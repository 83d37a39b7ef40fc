//! ttrace, the command-line front end (issues 4-7).
fn main() {
    eprintln!("ttrace: no subcommand is built yet (issue 4)");
    std::process::exit(2);
}
