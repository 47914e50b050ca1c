package status

import (
	"html/template"
	"strconv"
	"time"
)

var funcs = template.FuncMap{
	"age": func(sec float64) string {
		return time.Duration(sec * float64(time.Second)).Round(time.Millisecond).String()
	},
	"lag": func(l *int64) string {
		if l == nil {
			return "?"
		}
		return strconv.FormatInt(*l, 10)
	},
	"off": func(o int64) string {
		if o < 0 {
			return "–"
		}
		return strconv.FormatInt(o, 10)
	},
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return t.UTC().Format("15:04:05.000")
	},
}

// pageTmpl is the HTML page. html/template escapes every value by its
// context: keys, errors and topic names are user bytes.
var pageTmpl = template.Must(template.New("page").Funcs(funcs).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
{{if gt .RefreshSeconds 0}}<meta http-equiv="refresh" content="{{.RefreshSeconds}}">{{end}}
<title>tidemark status{{with .Member.Group}} — {{.}}{{end}}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin: 0 0 .3em; } h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
table { border-collapse: collapse; } th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f0f0f0; } td.l, th.l { text-align: left; }
tr.paused td { background: #fff6dd; } .bad { color: #b00; } .muted { color: #777; }
code { font: 13px ui-monospace, monospace; word-break: break-all; }
form { display: inline; } .box { margin: .3em 0; }
</style>
</head>
<body>
<h1>tidemark status</h1>
<p id="process">group <b id="group">{{.Member.Group}}</b>
· member <code id="member-id">{{if .Member.MemberID}}{{.Member.MemberID}}{{else}}(none yet){{end}}</code>
{{with .Member.InstanceID}}· instance <code>{{.}}</code>{{end}}
· generation <b id="generation">{{.Member.Generation}}</b>
· {{if .Member.Joined}}<span id="joined">joined</span>{{else}}<span id="joined" class="bad">not joined</span>{{end}}
· coordinator last answered {{with .Member.ContactAt}}{{when .}}{{else}}never{{end}}
{{with .Member.ContactErr}}· <span class="bad">last error: <code>{{.}}</code></span>{{end}}</p>
<p>stats of {{when .LoopAt}} (page {{when .GeneratedAt}} UTC){{if .Stopped}} · <b id="state" class="bad">stopped</b>{{else if .Stopping}} · <b id="state" class="bad">stopping</b>{{end}}
· {{.InFlight}} in flight · {{.Buffered}} fetched and unfinished · {{.Bytes}} bytes charged</p>

<h2>Partitions</h2>
{{if .Partitions}}
<table id="partitions">
<thead><tr><th class="l">partition</th><th>committed</th><th>safe</th><th>fetched</th><th>high watermark</th><th>lag</th>
<th class="l">paused</th><th>queued</th><th>in flight</th><th>uncommitted</th><th>lanes</th><th>dead letters</th><th>fenced</th><th>epoch</th></tr></thead>
<tbody>
{{range .Partitions}}<tr class="{{if .Paused}}paused{{end}}" data-partition="{{.Topic}}/{{.Partition}}">
<td class="l"><code>{{.Topic}}/{{.Partition}}</code></td><td>{{off .Committed}}</td><td>{{off .Safe}}</td><td>{{off .Fetched}}</td>
<td>{{off .HighWatermark}}</td><td>{{lag .Lag}}</td>
<td class="l">{{if .Paused}}paused{{range .PausedBy}} <span class="cause">{{.}}</span>{{end}}{{else}}<span class="muted">no</span>{{end}}</td>
<td>{{.Queued}}</td><td>{{.InFlight}}</td><td>{{.Uncommitted}}</td><td>{{.Lanes}}</td>
<td{{if .DeadLettered}} class="bad"{{end}}>{{.DeadLettered}}</td><td{{if .Fenced}} class="bad"{{end}}>{{.Fenced}}</td><td>{{.Epoch}}</td></tr>
{{end}}</tbody>
</table>
{{else}}<p id="partitions" class="muted">No partition assigned to this process.</p>{{end}}

<h2>Oldest unfinished records</h2>
<table id="oldest">
<thead><tr><th class="l">partition</th><th>offset</th><th class="l">key</th><th>age</th><th class="l">state</th><th>attempts</th><th class="l">last error</th></tr></thead>
<tbody>
{{range $p := .Partitions}}{{with $p.Oldest}}<tr class="oldest" data-partition="{{$p.Topic}}/{{$p.Partition}}">
<td class="l"><code>{{$p.Topic}}/{{$p.Partition}}</code></td><td class="offset">{{.Offset}}</td>
<td class="l key"><code>{{if $.KeysHidden}}<span class="muted">(hidden)</span>{{else if .Key}}{{.Key}}{{else}}<span class="muted">(null)</span>{{end}}</code></td>
<td>{{age .AgeSeconds}}</td><td class="l state">{{.State}}</td><td>{{.Attempts}}</td>
<td class="l err"><code>{{.Error}}</code></td></tr>
{{end}}{{end}}</tbody>
</table>

<h2>Operator pauses</h2>
<p id="operator-paused">{{if or .OperatorPaused.Topics .OperatorPaused.Partitions}}
{{range .OperatorPaused.Topics}}topic <code>{{.}}</code> {{end}}{{range .OperatorPaused.Partitions}}partition <code>{{.}}</code> {{end}}
{{else}}<span class="muted">none</span>{{end}}</p>
{{if .Controls}}<div id="controls">
{{range .OperatorPaused.Topics}}<form method="post" action="tidemark/resume"><input type="hidden" name="from" value="page"><input type="hidden" name="topic" value="{{.}}"><button>resume topic {{.}}</button></form> {{end}}
<div class="box"><form method="post" action="tidemark/pause"><input type="hidden" name="from" value="page">
topic <input name="topic" size="16" required> partition <input name="partition" size="4" placeholder="all">
<button>pause</button></form>
<form method="post" action="tidemark/resume"><input type="hidden" name="from" value="page">
topic <input name="topic" size="16" required> partition <input name="partition" size="4" placeholder="all">
<button>resume</button></form></div>
<p class="muted">An operator's pause stops fetching (records already fetched still run) until resumed; flow control never lifts it, and a partition revoked and assigned back to this process stays paused. It is this process's only and is forgotten on restart.</p>
</div>{{else}}<p class="muted">Controls are off.</p>{{end}}

<h2>Recent rebalances</h2>
{{if .Member.Rebalances}}<table id="rebalances">
<thead><tr><th class="l">at (UTC)</th><th class="l">kind</th><th>generation</th><th>took</th><th class="l">partitions</th></tr></thead>
<tbody>{{range .Member.Rebalances}}<tr><td class="l">{{when .At}}</td><td class="l">{{.Kind}}</td><td>{{.Generation}}</td><td>{{age .TookSeconds}}</td>
<td class="l"><code>{{range $i, $tp := .Partitions}}{{if $i}} {{end}}{{$tp}}{{end}}</code></td></tr>
{{end}}</tbody></table>{{else}}<p id="rebalances" class="muted">none yet</p>{{end}}
</body>
</html>
`))
