package policystore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"sort"
)

// The store's encoding of a set (pure): every field in the order of its Go type
// (an entry is only ever read by the binary that wrote it: its build ID is
// in the key), nil apart from empty, numbers exact. Not the policy types'
// JSON: it omits empty lists, and an empty list is not an absent one (a
// child role's `writable: []` drops its parent's list; absent, it would
// inherit it). Not encoding/gob either, which drops empty lists too. What
// cannot be read back exactly is an error, never a zero.
//
//	pointer, slice, map: 0 for nil; else 1 (a slice or map: its length+1, a
//	                     uvarint) and the value (elements; keys sorted,
//	                     each key then its value)
//	struct:              its fields in order (unexported ones refused)
//	string:              length (uvarint) and bytes
//	bool:                0 or 1
//	ints, uints:         varint, uvarint

// encodeValue appends v's encoding to b.
func encodeValue(b []byte, v reflect.Value) ([]byte, error) {
	var err error
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return append(b, 0), nil
		}
		return encodeValue(append(b, 1), v.Elem())
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			if !t.Field(i).IsExported() {
				return nil, fmt.Errorf("%s.%s is unexported: it cannot be stored", t, t.Field(i).Name)
			}
			if b, err = encodeValue(b, v.Field(i)); err != nil {
				return nil, err
			}
		}
		return b, nil
	case reflect.Slice:
		if v.IsNil() {
			return append(b, 0), nil
		}
		b = binary.AppendUvarint(b, uint64(v.Len())+1)
		for i := range v.Len() {
			if b, err = encodeValue(b, v.Index(i)); err != nil {
				return nil, err
			}
		}
		return b, nil
	case reflect.Map:
		if v.IsNil() {
			return append(b, 0), nil
		}
		if v.Type().Key().Kind() != reflect.String {
			return nil, fmt.Errorf("map key %s cannot be stored", v.Type().Key())
		}
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
		b = binary.AppendUvarint(b, uint64(len(keys))+1)
		for _, k := range keys {
			if b, err = encodeValue(b, k); err != nil {
				return nil, err
			}
			if b, err = encodeValue(b, v.MapIndex(k)); err != nil {
				return nil, err
			}
		}
		return b, nil
	case reflect.String:
		return append(binary.AppendUvarint(b, uint64(v.Len())), v.String()...), nil
	case reflect.Bool:
		if v.Bool() {
			return append(b, 1), nil
		}
		return append(b, 0), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return binary.AppendVarint(b, v.Int()), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return binary.AppendUvarint(b, v.Uint()), nil
	}
	return nil, fmt.Errorf("a %s cannot be stored", v.Type())
}

var errShort = errors.New("the entry ends early")

// decoder reads an encoding back, every length bounded by what is left.
type decoder struct{ b []byte }

func (d *decoder) uvarint() (uint64, error) {
	n, k := binary.Uvarint(d.b)
	if k <= 0 {
		return 0, errShort
	}
	d.b = d.b[k:]
	return n, nil
}

func (d *decoder) flag() (bool, error) {
	if len(d.b) == 0 {
		return false, errShort
	}
	f := d.b[0]
	d.b = d.b[1:]
	if f > 1 {
		return false, fmt.Errorf("flag %d is not 0 or 1", f)
	}
	return f == 1, nil
}

// length reads a slice's or map's length+1 (0: nil): each element takes
// at least a byte, so none is longer than what is left.
func (d *decoder) length() (int, bool, error) {
	n, err := d.uvarint()
	if err != nil || n == 0 {
		return 0, false, err
	}
	if n-1 > uint64(len(d.b)) {
		return 0, false, errShort
	}
	return int(n - 1), true, nil
}

// value sets v (settable, zero) from the encoding.
func (d *decoder) value(v reflect.Value) error {
	switch v.Kind() {
	case reflect.Pointer:
		set, err := d.flag()
		if err != nil || !set {
			return err
		}
		v.Set(reflect.New(v.Type().Elem()))
		return d.value(v.Elem())
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			if !t.Field(i).IsExported() {
				return fmt.Errorf("%s.%s is unexported", t, t.Field(i).Name)
			}
			if err := d.value(v.Field(i)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Slice:
		n, set, err := d.length()
		if err != nil || !set {
			return err
		}
		v.Set(reflect.MakeSlice(v.Type(), n, n))
		for i := range n {
			if err := d.value(v.Index(i)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Map:
		n, set, err := d.length()
		if err != nil || !set {
			return err
		}
		v.Set(reflect.MakeMapWithSize(v.Type(), n))
		for range n {
			k := reflect.New(v.Type().Key()).Elem()
			e := reflect.New(v.Type().Elem()).Elem()
			if err := d.value(k); err != nil {
				return err
			}
			if err := d.value(e); err != nil {
				return err
			}
			if v.MapIndex(k).IsValid() {
				return fmt.Errorf("map key %q twice", k.String())
			}
			v.SetMapIndex(k, e)
		}
		return nil
	case reflect.String:
		n, err := d.uvarint()
		if err != nil {
			return err
		}
		if n > uint64(len(d.b)) {
			return errShort
		}
		v.SetString(string(d.b[:n]))
		d.b = d.b[n:]
		return nil
	case reflect.Bool:
		f, err := d.flag()
		if err != nil {
			return err
		}
		v.SetBool(f)
		return nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, k := binary.Varint(d.b)
		if k <= 0 {
			return errShort
		}
		if v.OverflowInt(n) {
			return fmt.Errorf("%d overflows a %s", n, v.Type())
		}
		d.b = d.b[k:]
		v.SetInt(n)
		return nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := d.uvarint()
		if err != nil {
			return err
		}
		if v.OverflowUint(n) {
			return fmt.Errorf("%d overflows a %s", n, v.Type())
		}
		v.SetUint(n)
		return nil
	}
	return fmt.Errorf("a %s cannot be read", v.Type())
}

// encodeStored is the entry's bytes.
func encodeStored(e *storedSet) ([]byte, error) {
	return encodeValue(nil, reflect.ValueOf(e).Elem())
}

// decodeStored reads an entry's bytes, all of them.
func decodeStored(data []byte) (*storedSet, error) {
	d := &decoder{b: data}
	e := &storedSet{}
	if err := d.value(reflect.ValueOf(e).Elem()); err != nil {
		return nil, err
	}
	if len(d.b) > 0 {
		return nil, fmt.Errorf("%d bytes after the entry", len(d.b))
	}
	return e, nil
}
