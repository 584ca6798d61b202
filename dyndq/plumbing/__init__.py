"""ONNX plumbing, the layer below converters/: each rule of ONNX's file format written once.

- `walk`: every scope of a model (main graph, If/Loop/Scan bodies at any depth, model-local
  functions), every node where it stands, constants resolved as ONNX scopes names;
- `opsets`: reading and editing opset imports, resolving our nodes by them;
- `ir`: the lowest IR version opsets, functions and element types need;
- `names`: every name a model uses, fresh readable ones;
- `types`: type protos <-> TensorSpec, attribute kinds <-> ONNX's enums;
- `light`: a view of a model without the data of its big initializers.

It imports onnx and `dyndq.opdefs` only: converters/ and the face build on it.
"""
