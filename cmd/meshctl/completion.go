package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// completionCommand is `meshctl completion bash|zsh|fish`: the script that
// makes the shell complete meshctl's commands and flags. The scripts ask
// meshctl itself (urfave/cli's --generate-bash-completion), so they stay
// right as commands change.
func completionCommand() *cli.Command {
	return &cli.Command{
		Name:  "completion",
		Usage: "print the shell completion script: source <(meshctl completion bash), or zsh, or fish",
		Description: "bash: add `source <(meshctl completion bash)` to ~/.bashrc (it needs no bash-completion package).\n" +
			"zsh: add `source <(meshctl completion zsh)` to ~/.zshrc, after compinit.\n" +
			"fish: meshctl completion fish > ~/.config/fish/completions/meshctl.fish",
		ArgsUsage: "bash|zsh|fish",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usagef("completion wants one shell (bash, zsh or fish), got %d arguments", c.NArg())
			}
			switch sh := c.Args().First(); sh {
			case "bash":
				_, err := fmt.Fprint(c.App.Writer, bashCompletion)
				return err
			case "zsh":
				_, err := fmt.Fprint(c.App.Writer, zshCompletion)
				return err
			case "fish":
				script, err := c.App.ToFishCompletion()
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(c.App.Writer, script)
				return err
			default:
				return usagef("completion %q: want bash, zsh or fish", sh)
			}
		},
	}
}

// bashCompletion completes from what meshctl says the words so far allow.
// It needs nothing but bash (not the bash-completion package).
const bashCompletion = `# meshctl completion for bash: source <(meshctl completion bash)
_meshctl_complete() {
	local cur="${COMP_WORDS[COMP_CWORD]}"
	local words=("${COMP_WORDS[@]:0:COMP_CWORD}")
	local opts
	if [[ "$cur" == -* ]]; then
		opts=$("${words[@]}" "$cur" --generate-bash-completion 2>/dev/null)
	else
		opts=$("${words[@]}" --generate-bash-completion 2>/dev/null)
	fi
	local IFS=$'\n'
	COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -o bashdefault -o default -F _meshctl_complete meshctl
`

// zshCompletion is urfave/cli's zsh script, for meshctl.
const zshCompletion = `#compdef meshctl
# meshctl completion for zsh: source <(meshctl completion zsh)
_meshctl_complete() {
	local -a opts
	local cur
	cur=${words[-1]}
	if [[ "$cur" == "-"* ]]; then
		opts=("${(@f)$(${words[@]:0:#words[@]-1} ${cur} --generate-bash-completion)}")
	else
		opts=("${(@f)$(${words[@]:0:#words[@]-1} --generate-bash-completion)}")
	fi
	if [[ "${opts[1]}" != "" ]]; then
		_describe 'values' opts
	else
		_files
	fi
}
compdef _meshctl_complete meshctl
`
