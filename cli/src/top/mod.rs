//! `cnimesh top`: the tap stream of a resource ([`super::tap`]) aggregated by source,
//! destination, method and path ([`aggregate`]). On a terminal it redraws every second like
//! `top` until interrupted; with `--duration`, or when stdout is not a terminal, it prints the
//! table once at the end (the duration, the end of the stream, or Ctrl-C).
//!
//! Layer: runtime (operator CLI).

pub mod aggregate;

use std::io::{IsTerminal, Write};
use std::time::Duration;

use futures::StreamExt;

use self::aggregate::Top;
use super::ClusterArgs;
use super::tap::{Filter, Lines, open};

/// How often the terminal view is redrawn.
const REDRAW: Duration = Duration::from_secs(1);
/// ANSI: clear the screen and go home.
const CLEAR: &str = "\x1b[2J\x1b[H";

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub filter: Filter,
    /// Tap for this long, then print the table once (e.g. 5s).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
}

pub async fn top_main(cluster: &ClusterArgs, args: TopArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let lines = open(cluster, &args.filter, 0).await?;
    let redraw = args.duration.is_none() && std::io::stdout().is_terminal();
    let top = run(lines, args.duration, redraw.then_some(&mut *out)).await?;
    if !redraw {
        out.write_all(top.render().as_bytes())?;
    }
    Ok(())
}

/// Folds `lines` until `duration`, their end or Ctrl-C; redraws on `screen` every second.
async fn run(mut lines: Lines, duration: Option<Duration>, mut screen: Option<&mut impl Write>) -> anyhow::Result<Top> {
    let mut top = Top::default();
    let deadline = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut redraw = tokio::time::interval(REDRAW);
    loop {
        tokio::select! {
            _ = &mut deadline => break,
            _ = &mut interrupted => break,
            _ = redraw.tick(), if screen.is_some() => {
                if let Some(screen) = screen.as_mut() {
                    write!(screen, "{CLEAR}{}", top.render())?;
                    screen.flush()?;
                }
            }
            line = lines.next() => match line {
                Some(line) => top.add(&line?),
                None => break,
            },
        }
    }
    Ok(top)
}

#[cfg(test)]
mod tests;
