//! The `changes` and `filter` arguments of the fenced and versioned writes: jsonb objects of column
//! names to values, read straight from jsonb's binary form. pgrx's JsonB would print the jsonb as
//! text and parse that again with serde_json, a cost of its own in every fenced_update
//! (docs/benchmarks.md); and the statement that jsonb_to_record serves gets the argument's own datum back.
use pgrx::callconv::{Arg, ArgAbi};
use pgrx::datum::DatumWithOid;
use pgrx::nullable::Nullable;
use pgrx::pg_sys::{self, JsonbIteratorToken as Token};
use pgrx::FromDatum;
use std::ffi::{CStr, CString};

/// A jsonb argument, detoasted. Valid during the function call that received it, like a `&str`
/// argument: it points into the call's memory.
pub struct JsonArg(pg_sys::Datum);

pgrx::impl_sql_translatable!(JsonArg, arg_only = "jsonb");

/// One value of the object, as a fenced write uses it.
pub enum Value {
    Null,
    /// A string, a number or a boolean, as the text that jsonb_to_record hands to the input
    /// function of the column's type (for a number, numeric_out's text, as jsonb prints it).
    Scalar(CString),
    /// An array or an object, which only jsonb_to_record converts.
    Structured,
}

impl JsonArg {
    /// The object's keys (in jsonb's order) and values; None when the jsonb is not an object.
    pub fn object(&self) -> Option<Vec<(String, Value)>> {
        // SAFETY: a detoasted jsonb (see `from_polymorphic_datum`); the iterator reads only within
        // it, and JsonbIteratorNext fills `value` with pointers into it.
        unsafe {
            let jsonb = self.0.cast_mut_ptr::<pg_sys::Jsonb>();
            let mut iterator = pg_sys::JsonbIteratorInit(&mut (*jsonb).root);
            let mut value: pg_sys::JsonbValue = std::mem::zeroed();
            // Nested containers come back whole, as one jbvBinary value.
            let mut next =
                |value: &mut pg_sys::JsonbValue| pg_sys::JsonbIteratorNext(&mut iterator, value, true);
            if next(&mut value) != Token::WJB_BEGIN_OBJECT {
                return None;
            }
            let mut entries = Vec::new();
            let mut key = String::new();
            loop {
                match next(&mut value) {
                    Token::WJB_KEY => key = String::from_utf8_lossy(string(&value)).into_owned(),
                    Token::WJB_VALUE => entries.push((std::mem::take(&mut key), scalar(&value))),
                    Token::WJB_DONE => return Some(entries),
                    _ => {} // WJB_END_OBJECT
                }
            }
        }
    }

    /// The jsonb as PostgreSQL prints it, for error messages.
    pub fn text(&self) -> String {
        // SAFETY: jsonb_out reads a jsonb and returns a palloc'd C string.
        let text = unsafe { pgrx::direct_function_call::<&CStr>(pg_sys::jsonb_out, &[Some(self.0)]) };
        text.map_or_else(String::new, |t| t.to_string_lossy().into_owned())
    }

    /// The argument as a statement parameter of type jsonb.
    pub fn parameter<'a>(&self) -> DatumWithOid<'a> {
        // SAFETY: a jsonb datum that outlives the statement (see `JsonArg`).
        unsafe { DatumWithOid::new(self.0, pg_sys::JSONBOID) }
    }
}

/// SAFETY: `value` must be a jbvString.
unsafe fn string(value: &pg_sys::JsonbValue) -> &[u8] {
    let string = value.val.string;
    std::slice::from_raw_parts(string.val.cast::<u8>(), string.len as usize)
}

/// SAFETY: `value` must be a value JsonbIteratorNext returned.
unsafe fn scalar(value: &pg_sys::JsonbValue) -> Value {
    let text = match value.type_ {
        pg_sys::jbvType::jbvNull => return Value::Null,
        pg_sys::jbvType::jbvString => CString::new(string(value)).expect("jsonb strings hold no NUL"),
        pg_sys::jbvType::jbvBool => CString::from(if value.val.boolean { c"true" } else { c"false" }),
        pg_sys::jbvType::jbvNumeric => {
            let numeric = pg_sys::Datum::from(value.val.numeric);
            let text = pgrx::direct_function_call::<&CStr>(pg_sys::numeric_out, &[Some(numeric)]);
            CString::from(text.expect("numeric_out returns a string"))
        }
        _ => return Value::Structured,
    };
    Value::Scalar(text)
}

impl FromDatum for JsonArg {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        // Fully detoasted, with a 4-byte header, as the jsonb functions read it.
        (!is_null).then(|| JsonArg(pg_sys::pg_detoast_datum(datum.cast_mut_ptr()).into()))
    }
}

// As pgrx does for its own argument types.
unsafe impl<'fcx> ArgAbi<'fcx> for JsonArg {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        arg.unbox_arg_using_from_datum().unwrap_or_else(|| panic!("argument {index} must not be null"))
    }

    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> Nullable<Self> {
        arg.unbox_arg_using_from_datum().into()
    }
}
