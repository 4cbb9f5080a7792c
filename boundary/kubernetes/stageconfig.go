package kubernetes

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json"
)

// decodeStageConfig parses the stage's argument strictly: unknown
// members, an empty command, a bad id or a working directory that is not
// absolute and clean are refused.
func decodeStageConfig(s string) (stageConfig, error) {
	var cfg stageConfig
	if len(s) > maxStageConfigBytes {
		return cfg, fmt.Errorf("configuration of %d bytes, at most %d", len(s), maxStageConfigBytes)
	}
	if err := json.Unmarshal([]byte(s), &cfg, json.RejectUnknownMembers(true)); err != nil {
		return stageConfig{}, fmt.Errorf("bad configuration: %w", err)
	}
	switch {
	case len(cfg.Argv) == 0 || cfg.Argv[0] == "":
		return stageConfig{}, errors.New("bad configuration: no command")
	case !validID(cfg.ID):
		return stageConfig{}, fmt.Errorf("bad configuration: id %q", cfg.ID)
	case !filepath.IsAbs(cfg.Dir) || filepath.Clean(cfg.Dir) != cfg.Dir:
		return stageConfig{}, fmt.Errorf("bad configuration: working directory %q is not absolute and clean", cfg.Dir)
	}
	for _, kv := range cfg.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.IndexByte(kv, 0) >= 0 {
			return stageConfig{}, fmt.Errorf("bad configuration: environment entry %q", kv)
		}
	}
	for _, a := range cfg.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return stageConfig{}, errors.New("bad configuration: NUL in the command")
		}
	}
	return cfg, nil
}

// validID is a stage id as start makes them: "p" and a decimal number.
func validID(id string) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(id, "p"))
	return strings.HasPrefix(id, "p") && err == nil && n > 0 && len(id) < 16 && strconv.Itoa(n) == id[1:]
}
