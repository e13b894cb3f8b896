// SPDX-License-Identifier: Apache-2.0
// dashcheck: loads Grafana dashboards (JSON files named on the command
// line) into Grafana's own dashboard schema types, from Grafana's
// foundation SDK (Apache-2.0; the Grafana server itself is AGPL and not in
// Debian, so it cannot be run here).  A dashboard passes when it unmarshals
// strictly (no field the schema does not know, every value of the schema's
// type, each panel's options and field config by its panel plugin's types)
// and the schema's Validate accepts it.  Exit 0: all pass; 1: a failure,
// each printed with its file and the schema's error.
package main

import (
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// real: the SDK's generated functions return their error list as a typed
// cog.BuildErrors, which is a non-nil error even when the list is empty.
func real(err error) error {
	if be, ok := err.(cog.BuildErrors); ok && len(be) == 0 {
		return nil
	}
	return err
}

func check(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var d dashboard.Dashboard
	if err := real(d.UnmarshalJSONStrict(raw)); err != nil {
		return fmt.Errorf("strict load: %w", err)
	}
	if err := real(d.Validate()); err != nil {
		return fmt.Errorf("validate: %w", err)
	}
	if len(d.Panels) == 0 {
		return fmt.Errorf("no panels")
	}
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashcheck DASHBOARD.json...")
		os.Exit(2)
	}
	plugins.RegisterDefaultPlugins()
	failed := false
	for _, p := range os.Args[1:] {
		if err := check(p); err != nil {
			fmt.Printf("FAIL %s: %v\n", p, err)
			failed = true
			continue
		}
		fmt.Printf("ok %s\n", p)
	}
	if failed {
		os.Exit(1)
	}
}
