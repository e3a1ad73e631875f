package app

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Main runs the syncer command line (without the program's name) and returns its exit code: 0 done
// (or in sync), 1 something needs you (a one-shot command says what on stdout; the controller or the
// gateway stopped on an error), 2 bad flags or an error (one line on stderr).
func Main(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	x := &cli{getenv: getenv, stdout: stdout, stderr: stderr}
	root := x.command()
	root.SetArgs(withRunningFlags(root, args))
	cmd, err := root.ExecuteC()
	return x.exit(cmd, err)
}

// Command is the syncer's command tree, as `syncer --help` and the generated reference
// (docs/reference/cli.md, by tools/docgen) show it. Defaults that come from the environment
// ($POD_NAMESPACE) are those of getenv.
func Command(getenv func(string) string) *cobra.Command {
	return (&cli{getenv: getenv, stdout: io.Discard, stderr: io.Discard}).command()
}

// cli is what the commands take from outside: the environment and the standard streams.
type cli struct {
	getenv         func(string) string
	stdout, stderr io.Writer
	// parsed, when set, receives each command's validated configuration (*config or *gatewayConfig)
	// and arguments instead of the command running: tests parse command lines with it.
	parsed func(command string, cfg any, args []string)
}

// exitCode is a command's exit status once it has said why (or had nothing to say).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func (x *cli) exit(cmd *cobra.Command, err error) int {
	if err == nil {
		return 0
	}
	if code, ok := err.(exitCode); ok {
		return int(code)
	}
	path := "syncer"
	if cmd != nil {
		path = cmd.CommandPath()
	}
	fmt.Fprintf(x.stderr, "%s: %s\n", path, firstLine(err.Error()))
	return 2
}

const rootLong = `syncer is raysync: it gives every in-scope RayCluster the canonical token from one Secret, moves running
clusters to a new token only as a whole (a replacement or a restart, paced across the fleet), and keeps pull
secrets and the autoscaler's client certificate on Ray pods. Without a command it runs the controller (what
the chart's Deployment runs); the commands below are for people (status, rotate, adopt, pause, resume,
uninstall, revoke-previous),
the gateway's own process (gateway) and shell completion.

Which cluster it talks to: --kubeconfig when given; else the in-cluster config when KUBERNETES_SERVICE_HOST
and KUBERNETES_SERVICE_PORT are set (in a pod); else client-go's default loading rules ($KUBECONFIG, else
~/.kube/config, with its current context). So inside a pod, $KUBECONFIG is ignored unless passed as
--kubeconfig.

Invalid flags exit with status 2 and a one-line reason; so do two roles naming one Secret (the source, a
pull secret, the client certificate, the ledger, the gateway's table, the webhook certificate, or a pod
source's copy in a watched namespace: raysync would overwrite one with the other), and a flag given a value
that would change nothing because what it configures is off (--webhook-dns-names without --webhook-addr,
--gateway-grace without --gateway-table, ...): raysync never accepts and ignores a flag. For the same
reason the one-shot commands (status, rotate, adopt, pause, resume, uninstall, revoke-previous) refuse the
controller's own flags
(its servers, leader election, workers, logs, webhook, --prune): they take those that say what raysync
manages, where its objects are and how to reach the API, and inside raysync's container they inherit just
those from the running raysync. Flags take --flag value or --flag=value, before or after a command's
arguments ("--" ends them).`

const statusLong = `Reports, read-only, whether every in-scope RayCluster is in sync: every cluster's targets, rotation state
and stale pods, every source's validity and expiry, the clusters raysync did not adopt (with what adopting
them would do and the capacity that needs), and whether the wave is paused. Exit 0 in sync; 1 not: a target
out of sync, not owned or missing, a stale pod, a source invalid, a cluster behind, not adopted or blocked
(also a cluster held behind on purpose, by the hold or gateway policy: see "What to alert on" in the
monitoring guide), the wave paused, or a control ConfigMap value raysync cannot read; 2 error. Right after
installing into a running fleet, exit 1 is expected: its clusters run on KubeRay's tokens, not adopted.

It takes the syncer's flags: those that say what raysync manages matter here, and -n (raysync's namespace)
with --name finds its rotation ledger. Run in raysync's own container
(kubectl exec deploy/<release> -- /syncer status) it takes the running raysync's flags, and needs none.`

const rotateLong = `Asks the running raysync to move the named clusters (or, with --all, every cluster behind the current
canonical token) to the current token now, whatever their rotation policy: a RayService's cluster is
replaced (KubeRay's zero-downtime upgrade), any other cluster restarted as a whole. TARGET is NAMESPACE/NAME
(a RayCluster, else a RayService or RayJob of that name: a RayService's cluster name changes at every
upgrade) or KIND/NAMESPACE/NAME (kind raycluster, rayservice or rayjob).

It says what it will do to each target (will be replaced, will be restarted) before it marks anything
(annotation raysync.dev/rotate). A target that is not behind, already rotating, or that raysync cannot move
is refused with the reason: nothing is marked for it, and the exit code is 1 (0: every target requested;
2: error). raysync paces requests with the rest of the wave (--max-concurrent-rotations) and never touches
a RayJob's cluster while its job runs; each request moves a cluster once (syncer status shows the
progress). With --dry-run it says what it would do and marks nothing. It takes the syncer's flags, as
syncer status does (in raysync's container, the running raysync's).`

const uninstallLong = `After raysync is stopped (helm uninstall), lists what it leaves behind and, with --yes, removes it: it
resumes the RayClusters raysync suspended to restart them, removes raysync's annotations from RayClusters
and RayServices (not the RayService template's raysync.dev/rotation-id: removing it would start one more
blue-green upgrade), deletes raysync's copies no RayCluster names (one that is still named is kept, with the
reason) and raysync's own objects: the rotation ledger, the webhook's certificate Secret, the gateway's
table and the Lease. It never touches a Secret or Lease raysync does not mark as its own. --dry-run lists,
even with --yes. Exit 0 done or nothing to do, 1 something left (raysync still running, a copy still named,
a Lease not raysync's), 2 error.`

const revokeLong = `Makes the gateway refuse the previous canonical token at once (it is otherwise accepted for
--gateway-grace after a rotation). Clients still presenting it get 403 / UNAUTHENTICATED; check
raysync_gateway_previous_token_last_used_timestamp_seconds first. It takes the syncer's flags (-n and
--name find the rotation ledger; in raysync's container, the running raysync's); --dry-run says what it
would do and changes nothing. Exit 0 revoked (or would be), 1 nothing to revoke, 2 error.`

const gatewayLong = `Serves the Jobs API and dashboard (8265) and Ray Client (10001) of every token-auth RayService and
RayCluster the raysync controller publishes a route for: clients address <name>-gw.<namespace> and present
any live canonical token (current, previous within its grace period, or pending); the gateway forwards with
the token the cluster runs on. It reads only the table Secret, and takes none of the controller's flags.
The chart runs it as a Deployment of its own with gateway.enabled.

It dials heads through HTTP_PROXY when set, as Go does (Ray Client with CONNECT). Every request the gateway
forwards carries its cluster's token, so a proxy on that path sees every token: keep the heads out of it
with NO_PROXY=.svc,.svc.cluster.local (the gateway warns at start when HTTP_PROXY is set and NO_PROXY does
not cover .svc.<cluster domain>).`

const completionLong = `Prints a script that completes syncer's commands, flags and flag values in bash or zsh.

bash (needs the bash-completion package):
  source <(syncer completion bash)                                   # this shell
  syncer completion bash > /etc/bash_completion.d/syncer             # every new shell (as root)

zsh:
  source <(syncer completion zsh)                                    # this shell
  syncer completion zsh > "${fpath[1]}/_syncer"                      # every new shell (compinit must run)`

// command builds the tree: the controller at its root, then the commands.
func (x *cli) command() *cobra.Command {
	root := x.syncerCommand(&cobra.Command{
		Use:   "syncer",
		Short: "raysync: one canonical Ray auth token for every RayCluster",
		Long:  rootLong,
		Example: `  syncer --auth-source=raysync/ray-token --namespaces=ml-team,ml-batch -n raysync    # the controller
  syncer status --auth-source=raysync/ray-token --namespaces=ml-team,ml-batch -n raysync
  kubectl -n raysync exec deploy/raysync -- /syncer status                             # in the pod: no flags`,
	}, "", nil, func(c *config, _ []string) int { return runController(c, x.stderr) })
	root.CompletionOptions.DisableDefaultCmd = true
	root.SuggestionsMinimumDistance = 2
	root.SilenceErrors, root.SilenceUsage = true, true
	root.SetOut(x.stdout)
	root.SetErr(x.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		var unknown *pflag.NotExistError
		if errors.As(err, &unknown) && cmd != root && root.Flags().Lookup(unknown.GetSpecifiedName()) != nil {
			return fmt.Errorf("--%s is a flag of the controller that %s does not take: remove it (raysync never accepts and ignores a flag)",
				unknown.GetSpecifiedName(), cmd.CommandPath())
		}
		return fmt.Errorf("%s (%s --help lists the flags)", firstLine(err.Error()), cmd.CommandPath())
	})

	status := x.syncerCommand(&cobra.Command{
		Use:         statusCommand,
		Annotations: map[string]string{inheritsAnnotation: "true"},
		Short:       "report, read-only, whether every in-scope RayCluster is in sync (exit 0 yes, 1 no, 2 error)",
		Long:        statusLong,
		Example: `  kubectl -n raysync exec deploy/raysync -- /syncer status
  syncer status -o json --auth-source=raysync/ray-token --namespaces=ml-team,ml-batch -n raysync`,
	}, statusCommand, func(fs *pflag.FlagSet, c *config) {
		fs.StringVarP(&c.output, "output", "o", "table", "table or json")
	}, func(c *config, _ []string) int { return runStatus(c, x.stdout, x.stderr) })
	_ = status.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))

	rotate := x.syncerCommand(&cobra.Command{
		Use:         rotateCommand + " TARGET... | --all",
		Annotations: map[string]string{inheritsAnnotation: "true"},
		Short:       "ask the running raysync to move clusters behind the current token to it now",
		Long:        rotateLong,
		Example: `  kubectl -n raysync exec deploy/raysync -- /syncer rotate ml-team/inference
  kubectl -n raysync exec deploy/raysync -- /syncer rotate --all --dry-run`,
		Args: cobra.ArbitraryArgs,
	}, rotateCommand, func(fs *pflag.FlagSet, c *config) {
		fs.BoolVar(&c.all, "all", false, "every cluster behind the current token (instead of naming some)")
	}, func(c *config, targets []string) int { return runRotate(c, targets, x.stdout, x.stderr) })

	uninstall := x.syncerCommand(&cobra.Command{
		Use:         uninstallCommand,
		Annotations: map[string]string{inheritsAnnotation: "true"},
		Short:       "after helm uninstall: list (with --yes: remove) what raysync leaves behind",
		Long:        uninstallLong,
		Example:     `  syncer uninstall --auth-source=raysync/ray-token --namespaces=ml-team,ml-batch -n raysync --yes`,
	}, uninstallCommand, func(fs *pflag.FlagSet, c *config) {
		fs.BoolVar(&c.yes, "yes", false, "do what it lists (without it: only list)")
	}, func(c *config, _ []string) int { return runUninstall(c, x.stdout, x.stderr) })

	revoke := x.syncerCommand(&cobra.Command{
		Use:         revokeCommand,
		Annotations: map[string]string{inheritsAnnotation: "true"},
		Short:       "make the gateway refuse the previous canonical token now, before its grace period ends",
		Long:        revokeLong,
		Example:     `  kubectl -n raysync exec deploy/raysync -- /syncer revoke-previous --dry-run`,
	}, revokeCommand, nil, func(c *config, _ []string) int { return runRevoke(c, x.stdout, x.stderr) })

	adopt := x.syncerCommand(&cobra.Command{
		Use:         adoptCommand + " TARGET... | --all",
		Annotations: map[string]string{inheritsAnnotation: "true"},
		Short:       "let raysync move clusters that run on a token it did not write (say what that does first)",
		Long:        adoptLong,
		Example: `  kubectl -n raysync exec deploy/raysync -- /syncer adopt --all --dry-run
  kubectl -n raysync exec deploy/raysync -- /syncer adopt rayservice/ml-team/inference
  kubectl -n raysync exec deploy/raysync -- /syncer adopt namespace/ml-team`,
		Args: cobra.ArbitraryArgs,
	}, adoptCommand, func(fs *pflag.FlagSet, c *config) {
		fs.BoolVar(&c.all, "all", false, "every cluster in scope, and those created later (the control ConfigMap's adopt: all)")
	}, func(c *config, targets []string) int { return runAdopt(c, targets, x.stdout, x.stderr) })

	pause := x.syncerCommand(&cobra.Command{
		Use:         pauseCommand,
		Annotations: map[string]string{inheritsAnnotation: "true"},
		Short:       "stop raysync from starting any further replacement or restart, now (syncer resume continues)",
		Long:        pauseLong,
		Example:     `  kubectl -n raysync exec deploy/raysync -- /syncer pause --reason "wrong token rolled out, INC-1234"`,
	}, pauseCommand, func(fs *pflag.FlagSet, c *config) {
		fs.StringVar(&c.reason, "reason", "", "why (shown by syncer status)")
	}, func(c *config, _ []string) int { return runPause(c, true, x.stdout, x.stderr) })

	resume := x.syncerCommand(&cobra.Command{
		Use:         resumeCommand,
		Annotations: map[string]string{inheritsAnnotation: "true"},
		Short:       "let raysync start replacements and restarts again after syncer pause",
		Long:        resumeLong,
		Example:     `  kubectl -n raysync exec deploy/raysync -- /syncer resume`,
	}, resumeCommand, nil, func(c *config, _ []string) int { return runPause(c, false, x.stdout, x.stderr) })

	root.AddCommand(status, rotate, adopt, pause, resume, uninstall, revoke, x.gatewayCommand(), completionCommand(), x.versionCommand())
	return root
}

// syncerCommand gives cmd the syncer's flags and its own (own), validates them, and runs do with the
// configuration and the arguments. name is "" for the controller.
func (x *cli) syncerCommand(cmd *cobra.Command, name string, own func(*pflag.FlagSet, *config), do func(*config, []string) int) *cobra.Command {
	c, r := &config{}, &rawFlags{}
	fs := cmd.Flags()
	if own != nil {
		own(fs, c)
	}
	addSyncerFlags(fs, name, c, r, x.getenv)
	for flag, values := range map[string][]string{
		"log-format": {"json", "console"}, "log-level": {"debug", "info", "warn", "error"},
		"rotation-policy-rayservice": policies, "rotation-policy-raycluster": policies, "rotation-policy-rayjob": policies,
	} {
		if fs.Lookup(flag) != nil {
			_ = cmd.RegisterFlagCompletionFunc(flag, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
		}
	}
	if cmd.Args == nil {
		cmd.Args = noArgs
	}
	if cmd.ValidArgsFunction == nil {
		cmd.ValidArgsFunction = cobra.NoFileCompletions
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if name != "" {
			c.leaderElect = false // a one-shot command never leads
			c.oneShot = true
		}
		if err := c.validate(r); err != nil {
			return err
		}
		if name == "" {
			if err := c.noIneffectiveFlags(fs); err != nil {
				return err
			}
		}
		if x.parsed != nil {
			x.parsed(name, c, args)
			return nil
		}
		if code := do(c, args); code != 0 {
			return exitCode(code)
		}
		return nil
	}
	return cmd
}

var policies = []string{"replace", "restart", "hold", "gateway"}

func (x *cli) gatewayCommand() *cobra.Command {
	c, r := &gatewayConfig{}, &gatewayFlags{}
	cmd := &cobra.Command{
		Use:               gatewayCommand,
		Short:             "serve every cluster's Jobs API, dashboard and Ray Client behind the live canonical tokens",
		Long:              gatewayLong,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := c.validate(r); err != nil {
				return err
			}
			if x.parsed != nil {
				x.parsed(gatewayCommand, c, args)
				return nil
			}
			if code := runGateway(c, x.stderr); code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
	addGatewayFlags(cmd.Flags(), c, r, x.getenv)
	for flag, values := range map[string][]string{"log-format": {"json", "console"}, "log-level": {"debug", "info", "warn", "error"}} {
		_ = cmd.RegisterFlagCompletionFunc(flag, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
	}
	return cmd
}

func completionCommand() *cobra.Command {
	return &cobra.Command{
		Use:       "completion bash|zsh",
		Short:     "print a shell completion script for bash or zsh",
		Long:      completionLong,
		ValidArgs: []string{"bash", "zsh"},
		Args:      cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] == "zsh" {
				return cmd.Root().GenZshCompletion(cmd.OutOrStdout())
			}
			return cmd.Root().GenBashCompletionV2(cmd.OutOrStdout(), true)
		},
	}
}

// noArgs refuses arguments; a word that is almost a command's name is named.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		return fmt.Errorf("unexpected argument %q (the command %q?)", args[0], s[0])
	}
	return fmt.Errorf("unexpected argument %q", args[0])
}

// withRunningFlags puts, in front of a one-shot command's own arguments, the flags of the raysync
// running as PID 1 of this container that the command takes, when there is one (`kubectl exec
// deploy/raysync -- /syncer status`): the command then sees what the controller sees. The command's
// own flags come after, and win.
func withRunningFlags(root *cobra.Command, args []string) []string {
	cmd, rest, err := root.Find(args)
	if err != nil || cmd.Parent() != root || cmd.Annotations[inheritsAnnotation] == "" {
		return args
	}
	inherited := inheritedFlags(root, cmd, runningArgs())
	if len(inherited) == 0 {
		return args
	}
	return append(append([]string{cmd.Name()}, inherited...), rest...)
}

// inheritsAnnotation marks a one-shot command that takes the running raysync's flags in its container.
const inheritsAnnotation = "raysync.dev/inherits-running-flags"

// InheritedFlags are the flags of a running controller's arguments (argv, without the program) that
// the one-shot command takes and inherits inside raysync's container: the controller's own (its
// servers, leader election, workers, logs, webhook) and its --dry-run are left out.
func InheritedFlags(command string, argv []string) []string {
	root := Command(func(string) string { return "" })
	cmd, _, err := root.Find([]string{command})
	if err != nil || cmd == root {
		return nil
	}
	return inheritedFlags(root, cmd, argv)
}

func inheritedFlags(root, cmd *cobra.Command, argv []string) []string {
	var out []string
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		var f *pflag.Flag
		attached := false
		switch {
		case strings.HasPrefix(a, "--"):
			name, _, eq := strings.Cut(a[2:], "=")
			f, attached = root.Flags().Lookup(name), eq
		case strings.HasPrefix(a, "-") && len(a) > 1:
			f, attached = root.Flags().ShorthandLookup(a[1:2]), len(a) > 2
		}
		if f == nil {
			continue // an argument: the controller takes none
		}
		token := []string{a}
		if !attached && f.NoOptDefVal == "" && i+1 < len(argv) {
			i++
			token = append(token, argv[i])
		}
		if f.Name != "dry-run" && cmd.Flags().Lookup(f.Name) != nil {
			out = append(out, token...)
		}
	}
	return out
}

// runningArgs are the arguments of the raysync running as PID 1 of this container (none when PID 1 is
// another program, or this process).
func runningArgs() []string {
	self, err := os.Executable()
	if err != nil || os.Getpid() == 1 {
		return nil
	}
	b, err := os.ReadFile("/proc/1/cmdline")
	if err != nil {
		return nil
	}
	argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(argv) < 2 {
		return nil
	}
	st1, err1 := os.Stat(argv[0])
	st2, err2 := os.Stat(self)
	if err1 != nil || err2 != nil || !os.SameFile(st1, st2) {
		return nil
	}
	return argv[1:]
}
