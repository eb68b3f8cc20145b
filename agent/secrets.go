package agent

// recentSecrets bounds the dispatch secrets kept registered: one is at risk
// only while its invocation lives, and the set must not grow with every
// dispatch the process ever saw.
const recentSecrets = 4096

// learnSecrets registers a received dispatch's secret and credential values
// with Config.Secrets. Credential values stay registered: the server's
// profiles bound them and they may come back with any later dispatch.
func (a *Agent) learnSecrets(req *DispatchRequest) {
	r := a.cfg.Secrets
	if r == nil {
		return
	}
	for _, v := range req.Credentials {
		r.Add(v)
	}
	if req.Secret == "" {
		return
	}
	r.Add(req.Secret)
	a.secretsMu.Lock()
	a.recent = append(a.recent, req.Secret)
	var drop []string
	if len(a.recent) > recentSecrets {
		drop = append(drop, a.recent[0])
		a.recent = a.recent[1:]
	}
	a.secretsMu.Unlock()
	r.Remove(drop...)
}
