package handlers

import (
	"fmt"
	"net/http"
	"time"

	"github.com/go-json-experiment/json"
)

// eventKeepAlive keeps idle proxies from closing a quiet stream.
const eventKeepAlive = 15 * time.Second

// maxStream bounds one stream's life; the browser's EventSource reconnects.
const maxStream = 30 * time.Minute

type eventData struct {
	Kind     string `json:"kind"`
	ID       string `json:"id"`
	Revision int64  `json:"revision"`
}

// events streams read-model changes as Server-Sent Events. Each event names
// what changed; clients re-read the resource, so nothing secret can leak
// through the stream.
func (a *API) events(w http.ResponseWriter, r *http.Request) error {
	rc := http.NewResponseController(w)
	// The server's WriteTimeout is for ordinary answers; a stream has its own bound.
	_ = rc.SetWriteDeadline(time.Time{})
	ch, unsubscribe := a.Store.Subscribe()
	defer unsubscribe()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "retry: 3000\n: cursor %d\n\n", a.Store.Cursor().Revision)
	if err := rc.Flush(); err != nil {
		return nil
	}
	keep := time.NewTicker(eventKeepAlive)
	defer keep.Stop()
	end := time.NewTimer(maxStream)
	defer end.Stop()
	for {
		select {
		case <-r.Context().Done():
			return nil
		case <-a.streams:
			return nil
		case <-end.C:
			return nil
		case <-keep.C:
			fmt.Fprint(w, ": keep-alive\n\n")
		case c, ok := <-ch:
			if !ok {
				return nil
			}
			data, err := json.Marshal(eventData{Kind: c.Kind, ID: c.ID, Revision: c.Revision})
			if err != nil {
				return nil
			}
			fmt.Fprintf(w, "event: %s\nid: %d\ndata: %s\n\n", c.Kind, c.Revision, data)
		}
		if err := rc.Flush(); err != nil {
			return nil
		}
	}
}
