"""A PyTorch tutorial's CNN classifier, run by Ember: only the imports differ from the PyTorch
script. The task is synthetic (no dataset to download): which quadrant of a 16x16 image holds
the bright square? About 25 s on 2 cores, most of it compiling. Run: python examples/torch_cnn.py"""
import ember as torch                                    # import torch  # noqa: I001
import ember.nn as nn                                    # import torch.nn as nn
import ember.nn.functional as F                          # import torch.nn.functional as F
from ember.utils.data import DataLoader, TensorDataset   # from torch.utils.data import ...


def make_data(n):
    labels = torch.randint(0, 4, (n,))
    images = torch.randn(n, 1, 16, 16) * 0.3
    top = (labels // 2) * 8 + torch.randint(1, 5, (n,))
    left = (labels % 2) * 8 + torch.randint(1, 5, (n,))
    rows = torch.arange(16).view(1, 16, 1)
    cols = torch.arange(16).view(1, 1, 16)
    square = (rows >= top.view(-1, 1, 1)) & (rows < top.view(-1, 1, 1) + 3) \
        & (cols >= left.view(-1, 1, 1)) & (cols < left.view(-1, 1, 1) + 3)
    return images + 2.0 * square.unsqueeze(1).float(), labels


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train_loader = DataLoader(TensorDataset(*make_data(512)), batch_size=64, shuffle=True)
    test_x, test_y = make_data(256)
    net = Net().to(device)
    for m in net.modules():
        if isinstance(m, nn.Linear):
            nn.init.kaiming_uniform_(m.weight, nonlinearity="relu")
            nn.init.zeros_(m.bias)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    for epoch in range(4):
        net.train()
        running_loss = 0.0
        for inputs, labels in train_loader:
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = criterion(net(inputs), labels)
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 5.0)
            optimizer.step()
            running_loss += loss.item()
        scheduler.step()
        print(f"epoch {epoch + 1}  loss {running_loss / len(train_loader):.3f}  "
              f"lr {scheduler.get_last_lr()[0]:.4f}")

    net.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in DataLoader(TensorDataset(test_x, test_y), batch_size=128):
            outputs = net(images)
            correct += (outputs.argmax(1) == labels).sum().item()
    print(f"accuracy on the test images: {100 * correct / len(test_x):.1f} %")

    torch.save(net.state_dict(), "cnn.safetensors")
    copy = Net()
    copy.load_state_dict(torch.load("cnn.safetensors"))
    same = torch.allclose(copy.eval()(images), net(images))
    print(f"reloaded from cnn.safetensors: same outputs {same}")


if __name__ == "__main__":
    main()
