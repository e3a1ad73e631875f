package app

import (
	"io"
)

// parseCommand parses and validates a command line of cmd ("" for the controller) through the command
// tree, as the binary does, without running anything; it returns the configuration and the command's
// other arguments.
func parseCommand(cmd string, args []string, getenv func(string) string) (*config, []string, error) {
	var got *config
	var rest []string
	x := &cli{getenv: getenv, stdout: io.Discard, stderr: io.Discard, parsed: func(_ string, c any, a []string) {
		got, _ = c.(*config)
		rest = a
	}}
	root := x.command()
	if cmd != "" {
		args = append([]string{cmd}, args...)
	}
	root.SetArgs(args)
	if _, err := root.ExecuteC(); err != nil {
		return nil, nil, err
	}
	return got, rest, nil
}

// parseFlags parses and validates the controller's command line.
func parseFlags(args []string, getenv func(string) string) (*config, error) {
	c, _, err := parseCommand("", args, getenv)
	return c, err
}

// parseGatewayFlags parses and validates `syncer gateway`'s command line.
func parseGatewayFlags(args []string, getenv func(string) string) (*gatewayConfig, error) {
	var got *gatewayConfig
	x := &cli{getenv: getenv, stdout: io.Discard, stderr: io.Discard, parsed: func(_ string, c any, _ []string) { got, _ = c.(*gatewayConfig) }}
	root := x.command()
	root.SetArgs(append([]string{gatewayCommand}, args...))
	if _, err := root.ExecuteC(); err != nil {
		return nil, err
	}
	return got, nil
}
