package idemadmin

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/idem-dev/idem/idemstore"
)

// bulkView is a bulk action on the page: the answer to give (complete),
// the confirmation that lists every key, or what became of each.
type bulkView struct {
	// Mode is "answer", "confirm" or "done".
	Mode   string
	Action string
	// Keys are the selected keys, ID:ATTEMPT, posted again by each step.
	Keys []string
	Rows []bulkRow
	// Skips counts the rows that will be skipped as they are now.
	Skips  int
	Answer *idemstore.Response
	Result *BulkResult
}

// bulkRow is one selected key as it is now.
type bulkRow struct {
	ID, Attempt string
	Item        *Item
	// Skip says why the key will be skipped, as it is now.
	Skip string
}

// bulk runs the page's bulk action in steps, each posting the selected
// keys again: the queue's selection; for complete, the answer; the
// confirmation, which lists every key and its request; then the action,
// each key fenced to the attempt the queue showed.
func (h *Handler) bulk(w http.ResponseWriter, r *http.Request, sess *session) {
	v := h.base(w, r, sess, "Bulk action", "")
	form := pageForm{Action: r.PostFormValue("action"), Status: strings.TrimSpace(r.PostFormValue("status")),
		Headers: r.PostFormValue("headers"), Body: r.PostFormValue("body"), Note: r.PostFormValue("note")}
	v.Form = form
	selected := r.PostForm["k"]
	keys, err := pageBulkKeys(selected)
	if err == nil && form.Action != ActionRelease && form.Action != ActionComplete {
		err = badRequest("choose release or complete for the selected keys")
	}
	if err != nil {
		h.render(w, asError(err).Status, "error", h.base(w, r, sess, "Bulk action", "Not changed: "+asError(err).Detail+" Go back to the list and select the keys again."))
		return
	}
	bv := &bulkView{Action: form.Action, Keys: selected}
	v.Bulk = bv
	req := BulkRequest{Action: form.Action, Keys: keys, Note: form.Note}
	step := r.PostFormValue("step")
	if form.Action == ActionComplete && step != "" {
		rr, err := form.request()
		if err == nil {
			req.Answer = rr.Answer
			bv.Answer, err = rr.Check()
		}
		if err != nil {
			v.Error, step = "Not changed: "+asError(err).Detail, "" // back to the answer
		}
	}
	if _, err := cleanNote(form.Note); err != nil {
		v.Error, step = "Not changed: "+asError(err).Detail, ""
	}
	if r.PostFormValue("confirm") == "yes" && v.Error == "" {
		res, err := h.keys.Bulk(r.Context(), sess.name, req)
		if err != nil {
			v.Error = "Not changed: " + asError(err).Detail
		} else {
			bv.Mode, bv.Result, v.Title = "done", &res, "Bulk action done"
			h.render(w, http.StatusOK, "bulk", v)
			return
		}
	}
	bv.Mode = "confirm"
	if form.Action == ActionComplete && step == "" {
		bv.Mode = "answer"
		if form.Headers == "" && v.Error == "" {
			v.Form.Headers = "Content-Type: application/json"
		}
	}
	// Every key as it is now: the confirmation says which would be skipped.
	for _, k := range keys {
		row := bulkRow{ID: k.ID, Attempt: k.Attempt}
		it, err := h.keys.Get(r.Context(), k.ID)
		switch {
		case err != nil:
			row.Skip = asError(err).Detail
		case it.State != string(idemstore.StateNeedsReview):
			row.Item, row.Skip = &it, "no longer in review: it is "+it.State
		case it.Attempt != k.Attempt:
			row.Item, row.Skip = &it, "it went to review again since the list was read (attempt "+it.Attempt+" now)"
		default:
			row.Item = &it
		}
		if row.Skip != "" {
			bv.Skips++
		}
		bv.Rows = append(bv.Rows, row)
	}
	v.Title = fmt.Sprintf("Confirm: %s %d keys", form.Action, len(keys))
	h.render(w, http.StatusOK, "bulk", v)
}

// pageBulkKeys reads the keys the queue's boxes posted, each ID:ATTEMPT.
func pageBulkKeys(selected []string) ([]BulkKey, error) {
	switch {
	case len(selected) == 0:
		return nil, badRequest("no key is selected.")
	case len(selected) > MaxBulkKeys:
		return nil, badRequest("%d keys are selected; at most %d in one bulk action.", len(selected), MaxBulkKeys)
	}
	keys := make([]BulkKey, 0, len(selected))
	seen := make(map[string]bool, len(selected))
	for _, s := range selected {
		if seen[s] {
			continue
		}
		seen[s] = true
		i := strings.LastIndexByte(s, ':')
		if i < 1 {
			return nil, badRequest("the selection %s is not a key of the list.", quote(s, 80))
		}
		if err := pageAttempt(s[i+1:]); err != nil {
			return nil, err
		}
		keys = append(keys, BulkKey{ID: s[:i], Attempt: s[i+1:]})
	}
	return keys, nil
}
