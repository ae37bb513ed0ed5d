"""The toolkit below the region kinds: compiling and checking generated C++ (toolchain, compile,
sass_check), its shared templates, literals and glue pieces, dtypes, settings, and the tuning
database with the profiler runner. Nothing here knows a region kind; the kinds build on it, and the
passes above them (relax_cutlass.stages) use both."""
