package store

import (
	jsonv1 "encoding/json"
	"reflect"
	"testing"
	"time"

	"jobfence/jobs"
)

// fill sets every field reachable from v to a non-zero value, so a codec
// that drops or mangles any field of the record shows up.
func fill(v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("v<é&>\"" + v.Type().Name())
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(7)
	case reflect.Uint32, reflect.Uint64, reflect.Uint:
		v.SetUint(9)
	case reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		if depth > 6 {
			return
		}
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), depth+1)
	case reflect.Slice:
		if depth > 6 {
			return
		}
		s := reflect.MakeSlice(v.Type(), 2, 2)
		fill(s.Index(0), depth+1)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, depth+1)
		fill(e, depth+1)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(time.Date(2026, 11, 30, 8, 0, 0, 123456789, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), depth+1)
			}
		}
	}
}

// TestJobCodecMatchesEncodingJSON: the store's codec and encoding/json read
// each other's records to the same Job, fully populated or nearly empty, so
// records written before the codec changed still decode unchanged.
func TestJobCodecMatchesEncodingJSON(t *testing.T) {
	const id = "6f1c7a64-4f0e-4d5b-9d56-4f0c1b2a3e4d"
	full := &jobs.Job{}
	fill(reflect.ValueOf(full).Elem(), 0)
	full.ID, full.State, full.Resolved = id, jobs.Committed, true
	full.Result.Late = []jobs.LateReport{}
	bare := &jobs.Job{ID: id, State: jobs.Pending, Target: jobs.Target{Scope: "s", Name: "n", Display: "s/n"}}

	decodeV1 := func(t *testing.T, b []byte) *jobs.Job {
		t.Helper()
		var j jobs.Job
		if err := jsonv1.Unmarshal(b, &j); err != nil {
			t.Fatal(err)
		}
		// decodeJob's fills, applied the same way.
		out, err := decodeJob(id, mustV1(t, &j), 42)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for name, j := range map[string]*jobs.Job{"full": full, "bare": bare} {
		t.Run(name, func(t *testing.T) {
			v1 := mustV1(t, j)
			v2, err := encodeJob(j)
			if err != nil {
				t.Fatal(err)
			}
			fromV1, err := decodeJob(id, v1, 42)
			if err != nil {
				t.Fatal(err)
			}
			fromV2, err := decodeJob(id, v2, 42)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(fromV1, fromV2) {
				t.Fatalf("a record written by encoding/json decodes differently:\nv1 %s\nv2 %s", v1, v2)
			}
			if got := decodeV1(t, v2); !reflect.DeepEqual(got, fromV2) {
				t.Fatalf("encoding/json reads the record differently:\n%+v\n%+v", got, fromV2)
			}
		})
	}
}

func mustV1(t *testing.T, j *jobs.Job) []byte {
	t.Helper()
	c := *j
	c.BlockedReason = ""
	b, err := jsonv1.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
