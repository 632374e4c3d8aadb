//! `ferry completions <shell>`: the shell completion script (clap_complete) for bash, zsh,
//! fish, PowerShell or elvish, on stdout. E.g. `source <(ferry completions bash)`, or
//! `ferry completions zsh > "${fpath[1]}/_ferry"`.

use std::process::ExitCode;

use clap::{Args, CommandFactory};
use clap_complete::Shell;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    pub shell: Shell,
}

pub fn run(a: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut cmd = super::Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "ferry", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}
