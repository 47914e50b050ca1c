// Package promtext reads a Prometheus text exposition (a /metrics page) for
// the tests and the demo: each metric's value summed over its series.
package promtext

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Scrape GETs http://addr/metrics, within 5 s, and returns Sum of the page.
func Scrape(ctx context.Context, addr string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	return Sum(resp.Body)
}

// Sum returns each metric's value summed over its series (every label
// set): `name{a="1"} 2` and `name{a="2"} 3` give name 5. Comments and
// lines whose value does not parse are left out.
func Sum(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if line == "" || line[0] == '#' || i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name := line[:i]
		if j := strings.IndexAny(name, "{ "); j >= 0 {
			name = name[:j]
		}
		out[name] += v
	}
	return out, sc.Err()
}
